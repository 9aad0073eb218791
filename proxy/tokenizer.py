"""tiktoken behind a per-text cache.

Clients resend the whole history on every call, so nearly every message of a
request was counted before: the cache makes the Sentry's measurement cost
proportional to the new text only.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

__all__ = ["Tokenizer"]


class Tokenizer:
    def __init__(self, encoding: str, cache_size: int = 200_000):
        try:
            self.encoding = tiktoken.get_encoding(encoding)
        except ValueError as exc:
            raise ValueError(f"unknown tiktoken encoding {encoding!r}: {exc}") from None
        self.count = lru_cache(maxsize=cache_size)(self._count)

    def _count(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))
