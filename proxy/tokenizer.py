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

Paging counts each turn of a history as "[role] text", whose text the request
counted: such a line is counted from its text's count (``Tokenizer._tagged``).
"""

from __future__ import annotations

import re
from functools import lru_cache

import regex
import tiktoken

__all__ = ["Tokenizer"]

SEAM = "\n<"
# Texts that end a piece with every kind of line break, space run and symbol the
# pre-tokenizer could join across a seam; an encoding counts pieces only if each counts the same whole.
_PROBES = [
    "".join(f'{end}{gap}\n<Node id="p{i}">{i}</Node>' for i, end in enumerate(["x", ".", "9", "'s", "é", ">", "&amp;", " ", "\t", "/"]))
    for gap in ["", " ", "  ", "\t", "\n", "\r", "\r\n", " \n", "\n\n", "\n \n", "\t\n", "  \t"]
]


# A history's turn as paging lays it out: "[role] text" (``pcp_core.pages.logical.Turn.line``), its text one the request counted.
_TAGGED = re.compile(r"\[[a-z_]+\] ")
TAGS_KEPT = 64  # tags whose tokens are kept, the latest used (a role is one of a few; a client may make up more)


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
        # The encoding's pre-tokenizer: the pieces it cuts a text into are encoded each on its own.
        pattern = getattr(self.encoding, "_pat_str", None)
        self._pieces = regex.compile(pattern) if isinstance(pattern, str) else None
        self._piece = lru_cache(maxsize=1 << 16)(self._one_piece)
        self._tag = lru_cache(maxsize=TAGS_KEPT)(self._head)

    def count_built(self, text: str) -> int:
        """A text the proxy built: a prompt is new on every call, its lines mostly are not."""
        if self.piecewise and SEAM in text:
            return sum(map(self.lines, _lines(text)))
        return self.lines(text)

    def _count(self, text: str) -> int:
        """A text's tokens: a built prompt's by its pieces, a tagged line's by its parts, else whole."""
        if self.piecewise and SEAM in text:
            return self.count_built(text)
        tagged = self._tagged(text) if text[:1] == "[" else None
        return self._whole(text) if tagged is None else tagged

    def _tagged(self, line: str) -> int | None:
        """The tokens of "[role] text" from those of its text, or None where they are not worked out so.

        Paging counts every turn of a history as such a line, and the request
        counted its text: encoding the line again was a large part of a cold
        request at a million tokens (``bench/lean.py --cold-only``). The pre-tokenizer cuts a piece after the tag (the check is
        the tag's, once), and it cuts the text the same whether a space
        stands before it or not, but for its first piece, which takes the
        space: the line is the tag, that piece with its space, and the rest
        of the text. Only for a first piece of ASCII letters, which every
        version of Unicode reads alike (the encoder's regex engine and this
        one may not know the same letters); any other line is encoded whole.
        """
        tag = _TAGGED.match(line)
        if tag is None or self._pieces is None:
            return None
        space, text = tag.end() - 1, line[tag.end() :]
        alone = self._pieces.match(text)
        if alone is None:
            return None
        first, end = alone.group(), alone.end()
        if not (first.isascii() and first[:1].isalpha() and text[end : end + 1].isascii()):
            return None
        joined = self._pieces.match(line, space)
        if joined is None or joined.end() != tag.end() + end:  # the space went to the first piece, and only to it
            return None
        head = self._tag(line[:space])
        spaced, bare = self._piece(" " + first), self._piece(first)
        if head is None or spaced is None or bare is None:
            return None
        return head + spaced - bare + self.count(text)

    def _head(self, tag: str) -> int | None:
        """The tokens of ``tag`` if the pre-tokenizer cuts a piece at its end (None: it does not), followed, as
        it always is here, by a space and an ASCII letter."""
        line, at, tokens = tag + " a", 0, 0
        while at < len(tag) and self._pieces is not None:
            piece = self._pieces.match(line, at)
            counted = self._piece(piece.group()) if piece is not None and piece.end() > at else None
            if piece is None or counted is None:
                break
            tokens, at = tokens + counted, piece.end()
        return tokens if at == len(tag) else None

    def _one_piece(self, piece: str) -> int | None:
        """The tokens of one piece of the pre-tokenizer's, if it is one on its own too (None: it is not)."""
        alone = self._pieces.match(piece) if self._pieces is not None else None
        return self._whole(piece) if alone is not None and alone.end() == len(piece) else None

    def _whole(self, text: str) -> int:
        """A text's tokens, encoded whole."""
        return len(self.encoding.encode_ordinary(text))


def _lines(text: str) -> list[str]:
    """``text`` cut before every ``<`` that opens a line (each line keeps its line break)."""
    parts = text.split(SEAM)
    last = len(parts) - 1
    return [("<" if i else "") + part + ("\n" if i < last else "") for i, part in enumerate(parts)]
