"""Where memory pages live: ``MemoryStore``, the operations memory needs (kept in SQLite by ``sqlite_store``, in
Redis by ``redis_store``).

A scope is a string the caller's namespace prefixes (``scope_key``), so two
keys' scopes of one name never meet. Everything a write-back changes — its
pages, the conversation's claim on them, the tree's edges, their vectors —
commits in one transaction: a write-back cut short by a crash is never read.

The search indexes (``search.py``) are derived from this store: every page
has a ``row`` that only grows, and every removal is logged with a ``seq``, so
an index saved at some (row, seq) catches up from there, or is built again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Protocol

import msgspec

from pcp_core import Page
from pcp_core.memory import MemoryUse

from .bodies import PageBodies

__all__ = ["MemoryStore", "Stored", "Written", "scope_key"]


def scope_key(namespace: str, scope: str) -> str:
    """One caller's scope: the namespace (a fixed-length hash of its key) before the scope's name."""
    return f"{namespace}/{scope}"


class Stored(msgspec.Struct, frozen=True):
    """A page as the store holds it: its row (what the indexes address it by) and what ranking reads."""

    row: int
    page: Page
    conversation: str = ""
    recalls: int = 0  # requests it was given to
    vector: bytes | None = None  # float16, normalised
    record: bool = False  # adds nothing the scope held when written (``pcp_core.memory.novelty``): kept, not ranked
    shown: int = 0  # requests whose prompts showed it
    consulted: int = 0  # Consults that opened it
    used: int = 0  # the scope's request count when it was written or last consulted (``clock``)


class Written(msgspec.Struct, frozen=True):
    """What a write changed: the pages it added and the rows it removed (the indexes follow)."""

    added: list[Stored] = []
    removed: list[int] = []
    seq: int = 0  # the last removal it logged (0: none)


class MemoryStore(Protocol):
    """What memory asks of a store (an embedded SQLite file here; a shared server can sit beside it)."""

    bodies: PageBodies  # how its pages are kept as bytes (sealed with PCP_DATA_KEY)

    def missing(self, scope: str, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` the scope does not hold."""

    def write(self, scope: str, conversation: str, pages: Sequence[Page], vectors: dict[str, bytes], records: Collection[str] = ()) -> Written:
        """The conversation's pages are now ``pages``: new ones added, those no conversation holds any more removed."""

    def add(self, scope: str, pages: Sequence[Page], vectors: dict[str, bytes], owner: str = "", records: Collection[str] = ()) -> Written:
        """Pages no conversation writes (the consolidator's, an import's), children before their containers."""

    def remove(self, scope: str, ids: Sequence[str], rewritten: Sequence[Page] = (), hashes: Iterable[str] = ()) -> Written:
        """``ids`` removed from the scope, ``rewritten`` put in their place, ``hashes`` remembered as forgotten."""

    def pages(self, scope: str, ids: Sequence[str]) -> list[Page]:
        """The pages of ``ids`` the scope holds, in that order."""

    def stored(self, scope: str, rows: Sequence[int]) -> list[Stored]:
        """The stored pages at ``rows`` that belong to ``scope``."""

    def parents(self, scope: str, ids: Sequence[str]) -> dict[str, list[str]]:
        """The containers each of ``ids`` is a page of."""

    def listing(self, scope: str, after: int, limit: int) -> list[Stored]:
        """Up to ``limit`` stored pages after row ``after``, without their vectors."""

    def in_period(self, scope: str, start: str, end: str, limit: int) -> list[int]:
        """The rows of pages written from ``start`` to before ``end``, at most ``limit``."""

    def counts(self, scope: str, faded_before: int = 0) -> dict[str, int]:
        """The scope's counts of pages, records, conversations and forgotten turns."""

    def scopes(self, namespace: str) -> list[str]:
        """The names of the caller's scopes that hold a page or a forgotten turn, in name order."""

    def holds(self, scope: str) -> bool:
        """Whether the scope holds any page."""

    def rows_after(self, scope: str, row: int) -> int:
        """How many of the scope's pages were written after ``row``."""

    def forgotten(self, scope: str) -> set[str]:
        """The hashes of the scope's forgotten turns."""

    def has_vectors(self, scope: str) -> bool:
        """Whether any of the scope's pages has a vector."""

    def metabolise(self, scope: str, use: MemoryUse) -> int:
        """A request's use of the scope's pages: its clock ticks, the pages given, shown and consulted count it; the clock."""

    def clock(self, scope: str) -> int:
        """The requests the scope served (each request the Memory Router gave pages to)."""

    def changes(self, scope: str, after_row: int, after_seq: int) -> tuple[Iterator[Stored], list[int], int]:
        """What an index saved at (``after_row``, ``after_seq``) lacks: the pages added since, the rows removed since, and the last seq."""

    def watermark(self) -> tuple[int, int]:
        """The last row written and the last removal's number, store-wide."""

    def drop(self, scope: str) -> int:
        """Everything of the scope removed; how many pages went."""

    def close(self) -> None:
        """Release what the store holds open."""
