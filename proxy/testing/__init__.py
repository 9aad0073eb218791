"""Fakes for tests and benchmarks: a scripted upstream (``upstream``) speaking each API (``apis``),
a stand-in embedder (``embedder``) and a fake of Anthropic's prompt cache (``prompt_cache``).

Never imported by the product.
"""
