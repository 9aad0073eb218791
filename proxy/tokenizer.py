"""tiktoken behind a per-text cache.

Clients resend the whole history on every call, so nearly every message of a
request was counted before: the cache makes the Sentry's measurement cost
proportional to the new text only.

The prompts the proxy builds are XML with one element per line, and most of
their lines were in the prompt of the request (or round) before. tiktoken's
pre-tokenizer never joins a line break to a ``<`` after it, so a text is
counted as the sum of its pieces cut at every such seam, each piece counted
once and cached: a new prompt costs its new lines only, and the count stays
exact. The prompts themselves are not kept: each is new, and the cache would
fill with them. The encoding is checked to split so when the tokenizer is made; one
that does not is counted whole.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

__all__ = ["Tokenizer"]

SEAM = "\n<"
# Texts that end a piece with every kind of line break, space run and symbol the
# pre-tokenizer could join across a seam; an encoding counts pieces only if each counts the same whole.
_PROBES = [
    "".join(f'{end}{gap}\n<Node id="p{i}">{i}</Node>' for i, end in enumerate(["x", ".", "9", "'s", "é", ">", "&amp;", " ", "\t", "/"]))
    for gap in ["", " ", "  ", "\t", "\n", "\r", "\r\n", " \n", "\n\n", "\n \n", "\t\n", "  \t"]
]


class Tokenizer:
    """``count`` for what clients send (each text kept: it comes again), ``count_built``
    for what the proxy builds (prompts, nodes: their lines kept, never the whole)."""

    def __init__(self, encoding: str, cache_size: int = 200_000):
        try:
            self.encoding = tiktoken.get_encoding(encoding)
        except ValueError as exc:
            raise ValueError(f"unknown tiktoken encoding {encoding!r}: {exc}") from None
        self.count = lru_cache(maxsize=cache_size)(self._count)
        # Lines of the prompts the proxy builds, and its texts that have none.
        self.lines = lru_cache(maxsize=cache_size)(self._whole)
        self.piecewise = False
        self.piecewise = all(self._whole(probe) == self.count_built(probe) for probe in _PROBES)

    def count_built(self, text: str) -> int:
        """A text the proxy built: a prompt is new on every call, its lines mostly are not."""
        if self.piecewise and SEAM in text:
            return sum(map(self.lines, _lines(text)))
        return self.lines(text)

    def _count(self, text: str) -> int:
        return self.count_built(text) if self.piecewise and SEAM in text else self._whole(text)

    def _whole(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))


def _lines(text: str) -> list[str]:
    """``text`` cut before every ``<`` that opens a line (each line keeps its line break)."""
    parts = text.split(SEAM)
    last = len(parts) - 1
    return [("<" if i else "") + part + ("\n" if i < last else "") for i, part in enumerate(parts)]
