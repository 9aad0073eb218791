"""Ranking pages by a request's intent: BM25, and the Router-MMU (§VI.1–2) over it."""
