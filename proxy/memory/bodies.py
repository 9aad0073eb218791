"""A memory page as a store keeps it: msgpack, sealed with ``PCP_DATA_KEY`` when it is set.

The scope is the associated data, so a page copied into another caller's
scope does not open there. A page that does not open (another key, or none)
reads as missing, as a session that does not open is paged again. What the
search indexes derive from pages stays as it is: vectors, and the keyword
index's vocabulary (the distinct words of keywords and summaries, not text).
"""

from __future__ import annotations

import msgspec

from pcp_core import Page

from ..storage.sealing import Sealer

__all__ = ["PageBodies"]

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Page).decode


class PageBodies:
    def __init__(self, sealer: Sealer | None = None):
        """Pages sealed with ``sealer`` (or kept plain without a key)."""
        self.sealer = sealer or Sealer()

    def encode(self, scope: str, page: Page) -> bytes:
        """``page`` encoded and sealed for ``scope``."""
        return self.sealer.seal(_encode(page), _context(scope))

    def decode(self, scope: str, body: bytes) -> Page | None:
        """The page, or None when it is sealed and this key does not open it."""
        opened = self.sealer.open(body, _context(scope))
        return None if opened is None else _decode(opened)


def _context(scope: str) -> str:
    """What a scope's pages are sealed to: a page of one scope never opens as another's."""
    return f"memory|{scope}"
