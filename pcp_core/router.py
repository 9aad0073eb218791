"""The Router-MMU (§VI.1–2): anchor the intent, then address pages by it.

Broad match here is BM25 over the pages' keywords and text; it needs no model,
so it is the floor every deployment has. Dense recall and precision selection
can be layered on by the host, which owns the embedding model.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import msgspec

from .consolidator import terms
from .pages import Page, turn_texts, without_turn_markers
from .tokens import CountText, prompt_tokens

__all__ = ["Bm25", "Intent", "anchor_intent", "dense_ranking", "dense_units", "fuse", "precision_selection", "router_prompt", "stem"]

RRF_K = 60  # reciprocal-rank fusion constant (Cormack et al.): flattens the head of each list

# Below this many content terms a query says too little to address by (§VI.1 "continue").
LOW_ENTROPY_TERMS = 2
HEAD_WEIGHT = 0.25
# Pseudo-relevance feedback: terms of the best pages join the query, lightly.
FEEDBACK_PAGES = 3
FEEDBACK_TERMS = 20
FEEDBACK_WEIGHT = 0.2
# Dense recall: a turn's score gains this share of its better neighbour's, since
# evidence comes in exchanges (a question and its answer, a story and its date).
NEIGHBOUR_SHARE = 0.3


class Intent(msgspec.Struct, frozen=True):
    """The Intent Focus: weighted terms from the tail (the query) and, lightly, the head."""

    text: str
    weights: dict[str, float]
    borrowed: bool = False  # the query was too thin and borrowed the previous summary


def anchor_intent(head: str, tail: str, previous: str = "") -> Intent:
    weights: dict[str, float] = {}
    for term in terms(head):
        weights[term] = max(weights.get(term, 0.0), HEAD_WEIGHT)
    tail_terms = set(terms(tail))
    borrowed = len(tail_terms) < LOW_ENTROPY_TERMS and bool(previous)
    if borrowed:
        for term in terms(previous):
            weights[term] = max(weights.get(term, 0.0), 0.6)
    for term in tail_terms:
        weights[term] = 1.0
    text = f"{tail}\n{previous}" if borrowed else tail
    return Intent(text=text, weights=weights, borrowed=borrowed)


_SUFFIXES = ("ations", "ation", "ings", "ing", "edly", "ed", "ies", "es", "ers", "er", "ly", "s")


@lru_cache(maxsize=65536)
def stem(term: str) -> str:
    """A light suffix stripper: "adopting", "adopted", "adopts" all address "adopt"."""
    if term[:1].isdigit():
        return term
    for suffix in _SUFFIXES:
        if term.endswith(suffix) and len(term) - len(suffix) >= 3:
            term = term[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    if len(term) > 3 and term[-1] == term[-2] and term[-1] not in "lsz":
        term = term[:-1]  # "planned" -> "plann" -> "plan"
    return term.removesuffix("e") if len(term) > 4 else term


class Bm25:
    """Okapi BM25 over pages (k1=1.2, b=0.75); keywords count twice, as index keys should."""

    def __init__(self, pages: Iterable[Page], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        self.ids: list[str] = []
        self.tf: list[Counter[str]] = []
        self.lengths: list[int] = []
        df: Counter[str] = Counter()
        for page in pages:
            counts = _term_counts(page.content or page.summary, page.keywords)
            self.ids.append(page.id)
            self.tf.append(counts)
            self.lengths.append(sum(counts.values()))
            df.update(counts.keys())
        n = len(self.ids)
        self.avg_length = (sum(self.lengths) / n) if n else 1.0
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, weights: Mapping[str, float]) -> dict[str, float]:
        return self._scores(_stemmed(weights))

    def _scores(self, weights: Mapping[str, float]) -> dict[str, float]:
        """BM25 of every page for weights over stemmed terms."""
        weighted = {t: w * self.idf[t] * (self.k1 + 1) for t, w in weights.items() if t in self.idf}
        wanted = weighted.keys()
        out: dict[str, float] = {}
        for page_id, tf, length in zip(self.ids, self.tf, self.lengths):
            common = wanted & tf.keys()  # a set operation in C: most pages share nothing with the query
            if common:
                norm = self.k1 * (1 - self.b + self.b * length / self.avg_length)
                score = sum(weighted[t] * tf[t] / (tf[t] + norm) for t in common)
                if score > 0:
                    out[page_id] = score
        return out

    def rank(self, weights: Mapping[str, float], limit: int | None = None) -> list[tuple[str, float]]:
        return _ranked(self.scores(weights), limit)

    def rank_with_feedback(self, weights: Mapping[str, float], pages: int = FEEDBACK_PAGES, terms: int = FEEDBACK_TERMS) -> list[tuple[str, float]]:
        """Pseudo-relevance feedback (RM3-style): the query, plus the most telling terms of its best pages.

        A question and its evidence often share few words ("identity" against
        "transgender"); the pages the question does match best tend to speak of
        the same things in the evidence's words. On the LoCoMo dev split this puts
        every evidence page of a question among the 24 best for 0.79 of them, against
        0.75 without.
        """
        query = _stemmed(weights)
        position = {page_id: i for i, page_id in enumerate(self.ids)}
        telling: Counter[str] = Counter()
        for page_id, _ in _ranked(self._scores(query), pages):
            for term, count in self.tf[position[page_id]].items():
                telling[term] += count * self.idf[term]
        expanded = dict(query)
        for term, _ in telling.most_common(terms):
            expanded.setdefault(term, FEEDBACK_WEIGHT)
        return _ranked(self._scores(expanded), None)


def _stemmed(weights: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for term, weight in weights.items():
        key = stem(term)
        out[key] = max(out.get(key, 0.0), weight)
    return out


def _ranked(scores: dict[str, float], limit: int | None) -> list[tuple[str, float]]:
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    return ranked[:limit] if limit else ranked


@lru_cache(maxsize=65536)
def _term_counts(text: str, keywords: tuple[str, ...]) -> Counter[str]:
    """Stemmed term counts of a page; cached, since a session's pages are indexed on every request.

    The "[assistant]" markers of the page layout are not words anyone said.
    Callers must not change the counter they get.
    """
    counts = Counter(stem(t) for t in terms(without_turn_markers(text)))
    counts.update(stem(k) for keyword in keywords for k in terms(keyword))
    return counts


def dense_units(pages: Sequence[Page]) -> tuple[list[str], list[str]]:
    """What dense recall embeds, in conversation order: each turn with the turn before it.

    A turn alone is often a fragment ("Yes, last May!"); with the turn it answers
    it says what it is about. Returns (texts, the page of each text).
    """
    texts: list[str] = []
    owners: list[str] = []
    previous = ""
    for page in pages:
        for line in turn_texts(page.content):
            turn = without_turn_markers(line)
            texts.append(f"{previous}\n{turn}" if previous else turn)
            owners.append(page.id)
            previous = turn
    return texts, owners


def dense_ranking(vectors: Any, owners: Sequence[str], neighbour_share: float = NEIGHBOUR_SHARE) -> list[str]:
    """Pages by their best row's cosine similarity to the first row (the intent).

    Rows are unit vectors; ``owners[i]`` is the page of row ``i + 1`` (a page may
    own several), and rows are in conversation order, so a row's neighbours are
    the turns around it.
    """
    import numpy as np

    scores = vectors[1:] @ vectors[0]
    if neighbour_share and len(scores) > 1:
        padded = np.pad(scores, 1, constant_values=-1.0)
        scores = scores + neighbour_share * np.maximum(padded[:-2], padded[2:])
    best: dict[str, float] = {}
    for owner, score in zip(owners, scores.tolist()):
        if score > best.get(owner, -2.0):
            best[owner] = score
    return sorted(best, key=lambda p: -best[p])


def fuse(*rankings: Sequence[str], weights: Sequence[float] | None = None) -> list[str]:
    """Weighted reciprocal-rank fusion: a page ranked well by either list ranks well."""
    score: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings)):
        for rank, page_id in enumerate(ranking):
            score[page_id] = score.get(page_id, 0.0) + weight / (RRF_K + rank + 1)
    return sorted(score, key=lambda p: -score[p])


# -- precision selection by a router model (§VI.2) -----------------------------------

ROUTER_CANDIDATES = 12  # the best-ranked pages a router model reads
ROUTER_INSTRUCTIONS = (
    "You address the pages of a long conversation. Each line below is one page: its id, "
    "its date and its summary. Reply with the ids of the pages most likely to hold what "
    "answers the question, most useful first, separated by commas, and nothing else. "
    "Leave out pages that do not help."
)
_WORD_TOKEN = re.compile(r"\w+")  # page ids are short hex hashes


def router_prompt(intent: Intent, candidates: Sequence[Page], budget: int, count: CountText) -> list[dict[str, str]]:
    """Chat messages asking a router model to pick among ``candidates``, within ``budget`` tokens.

    The model compares the intent with page summaries, as §VI.2 has it; the
    worst-ranked candidates are left out until the prompt fits.
    """
    lines = [f"[{page.id}] {page.timestamp[:10]} {page.summary}" for page in candidates]
    while True:
        messages = [
            {"role": "system", "content": ROUTER_INSTRUCTIONS},
            {"role": "user", "content": f"Question: {intent.text}\n\nPages:\n" + "\n".join(lines)},
        ]
        if not lines or prompt_tokens(messages, count) <= budget:
            return messages
        lines.pop()


def precision_selection(ranked: Sequence[str], reply: str, candidates: Sequence[str]) -> list[str]:
    """``ranked`` with the candidates the router model chose first, in its order.

    Ids it names that were not candidates are ignored, so a model that invents
    or misspells ids changes nothing; the rest keep the broad match's order.
    """
    allowed = set(candidates)
    chosen = dict.fromkeys(t for t in _WORD_TOKEN.findall(reply) if t in allowed)
    return [*chosen, *(page_id for page_id in ranked if page_id not in chosen)]
