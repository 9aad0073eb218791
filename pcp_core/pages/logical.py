"""Logical pages (§5.1): Original pages hold evidence, Consolidated pages hold a tree of them.

Pages are immutable values. Their ids are short content hashes, so the same turns
always page to the same id and a page can be cached and found again by content;
the index (``pcp_core.pages.index``) makes ids unique within one address space.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import TypeVar

import msgspec

__all__ = [
    "AnyPage",
    "at_depth",
    "ConsolidatedPage",
    "Origin",
    "OriginalPage",
    "Page",
    "Turn",
    "View",
    "iso_timestamp",
    "short_hash",
    "tree_depths",
    "without_turn_markers",
]

ID_LENGTH = 8


class Origin(StrEnum):
    HISTORY = "History"
    STORAGE = "Storage"


class View(StrEnum):
    """Semantic view states (§7.1), in increasing resolution."""

    SUMMARY = "Summary"
    DETAIL = "Detail"
    UNPACKED = "Unpacked"


class _Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """What every page carries (§5.1)."""

    id: str
    origin: Origin
    depth: int
    timestamp: str
    keywords: tuple[str, ...]
    summary: str
    # Original: the verbatim evidence. Consolidated: the "full text of the
    # container summary" shown at view=Detail (§7.2).
    content: str = ""
    # Positions in the conversation, [first_turn, last_turn], for history pages.
    first_turn: int = -1
    last_turn: int = -1
    draft: bool = False


class OriginalPage(_Manifest, frozen=True, tag="Original", kw_only=True):
    """A leaf: the verbatim evidence of a group of turns (or a block of a file)."""


class ConsolidatedPage(_Manifest, frozen=True, tag="Consolidated", kw_only=True):
    """A container: the consensus of its children, which it can be Unpacked into."""

    source_ids: tuple[str, ...]


Page = OriginalPage | ConsolidatedPage
# A page of either kind, given back as the same kind by what copies it.
AnyPage = TypeVar("AnyPage", bound=Page)


def short_hash(*parts: str, length: int = ID_LENGTH) -> str:
    """A short hex id hashed from ``parts``."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\x1f")
    return digest.hexdigest()[:length]


def iso_timestamp(moment: datetime | float) -> str:
    """ISO-8601 to the second, UTC, as the spec's examples write it."""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    return moment.astimezone(UTC).replace(tzinfo=None, microsecond=0).isoformat()


class Turn(msgspec.Struct, frozen=True):
    """One message of the conversation, as the pages see it (a Dialogue PBlock's unit)."""

    index: int
    role: str
    text: str
    timestamp: str

    def line(self) -> str:
        """The turn as a page's content holds it: its role marker, then its text."""
        return f"[{self.role}] {self.text}"


# How an Original page's content lays its turns out: one ``Turn.line()`` each.
_TURN_MARKER = re.compile(r"^\[[a-z_]+\] ", re.M)


def without_turn_markers(content: str) -> str:
    """The content with the "[role] " marker of each turn removed: only the turns' own text."""
    return _TURN_MARKER.sub("", content)


def tree_depths(pages: Sequence[Page]) -> dict[str, int]:
    """Each page's depth, counted from its root (1) down: known only once the tree is whole."""
    children = {page.id: page.source_ids for page in pages if isinstance(page, ConsolidatedPage)}
    below = {child for ids in children.values() for child in ids}
    depths: dict[str, int] = {}
    level, depth = [page.id for page in pages if page.id not in below], 1
    while level:  # a level at a time, from the roots down
        down: list[str] = []
        for page_id in level:
            depths[page_id] = depth
            down += children.get(page_id, ())
        level, depth = down, depth + 1
    return depths


def at_depth(page: AnyPage, depth: int) -> AnyPage:
    """``page`` at ``depth`` in its tree."""
    return page if page.depth == depth else msgspec.structs.replace(page, depth=depth)
