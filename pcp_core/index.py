"""The page index (§5.3): one address space of pages, their tree, heat and activation.

Ids are unique here: two different pages whose short hashes collide get a longer
hash. The tree is stored as parent links beside ``source_ids``; roots are kept
in time order, which is the order of the Linear_Flow.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from enum import StrEnum

import msgspec

from .pages import ConsolidatedPage, Page, short_hash

__all__ = ["Activation", "Entry", "PageIndex", "UnknownPage"]

HEAT_DECAY = 0.5


class Activation(StrEnum):
    HOT = "Hot"  # injected with its content
    INDEXED = "Indexed"  # present by its summary
    SHELVED = "Shelved"  # registered, not in the horizon


class UnknownPage(KeyError):
    def __str__(self) -> str:
        return f"no page with id {self.args[0]!r}"


class Entry(msgspec.Struct):
    page: Page
    parent: str | None = None
    activation: Activation = Activation.INDEXED
    heat: float = 0.0
    last_touched: int = 0
    topic: str = ""


class PageIndex:
    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self._roots: dict[str, None] = {}  # insertion order breaks ties in time
        self._ordered: list[str] | None = []  # the roots in time order, once asked for
        self.clock = 0  # rounds seen; staleness is measured in it

    @property
    def roots(self) -> list[str]:
        """Pages without a container, in time order (the order of the Linear_Flow)."""
        if self._ordered is None:
            self._ordered = sorted(self._roots, key=lambda pid: self.entries[pid].page.first_turn)
        return self._ordered

    def __contains__(self, page_id: object) -> bool:
        return page_id in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[Page]:
        return (entry.page for entry in self.entries.values())

    # -- registration ----------------------------------------------------------
    def register(self, page: Page, topic: str = "") -> Page:
        """Add a page (children before their container); returns it with its final id."""
        existing = self.entries.get(page.id)
        if existing is not None:
            if _same(existing.page, page):
                return existing.page
            page = msgspec.structs.replace(page, id=self._unique_id(page))
        self.entries[page.id] = Entry(page=page, topic=topic)
        if isinstance(page, ConsolidatedPage):
            for child in page.source_ids:
                self.entries[child].parent = page.id
                self._roots.pop(child, None)
        self._roots[page.id] = None
        self._ordered = None  # sorting once per read, not per page, keeps registering linear
        return page

    def _unique_id(self, page: Page) -> str:
        length = len(page.id)
        while True:
            length += 2
            candidate = short_hash(page.summary, repr(page), length=length)
            if candidate not in self.entries:
                return candidate

    # -- reading -------------------------------------------------------------
    def get(self, page_id: str) -> Page:
        try:
            return self.entries[page_id].page
        except KeyError:
            raise UnknownPage(page_id) from None

    def entry(self, page_id: str) -> Entry:
        try:
            return self.entries[page_id]
        except KeyError:
            raise UnknownPage(page_id) from None

    def children(self, page_id: str) -> list[Page]:
        page = self.get(page_id)
        return [self.get(c) for c in page.source_ids] if isinstance(page, ConsolidatedPage) else []

    def parent(self, page_id: str) -> str | None:
        return self.entry(page_id).parent

    def ancestors(self, page_id: str) -> list[str]:
        """Parent first, root last."""
        chain = []
        parent = self.parent(page_id)
        while parent is not None:
            chain.append(parent)
            parent = self.parent(parent)
        return chain

    def leaves(self, page_ids: Iterable[str] | None = None) -> list[Page]:
        """Original pages under ``page_ids`` (all roots by default), in time order.

        A branch (§VI.5) holds pages from across time, so the tree's order is
        not always the conversation's.
        """
        found: list[Page] = []
        self._collect(self.roots if page_ids is None else page_ids, found)
        return sorted(found, key=lambda page: page.first_turn)

    def _collect(self, page_ids: Iterable[str], into: list[Page]) -> None:
        for page_id in page_ids:
            page = self.get(page_id)
            if isinstance(page, ConsolidatedPage):
                self._collect(page.source_ids, into)
            else:
                into.append(page)

    # -- heat and staleness ----------------------------------------------------
    def touch(self, page_id: str, heat: float = 1.0) -> None:
        entry = self.entry(page_id)
        entry.heat += heat
        entry.last_touched = self.clock

    def tick(self) -> None:
        """End of a round: heat decays, staleness grows."""
        self.clock += 1
        for entry in self.entries.values():
            entry.heat *= HEAT_DECAY

    def staleness(self, page_id: str) -> int:
        return self.clock - self.entry(page_id).last_touched

    def activate(self, page_id: str, activation: Activation) -> None:
        self.entry(page_id).activation = activation


def _same(a: Page, b: Page) -> bool:
    return type(a) is type(b) and msgspec.structs.replace(a, depth=b.depth) == b
