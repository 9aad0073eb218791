"""The page index (§5.3): one address space of pages, their tree, heat and activation.

Ids are unique here: two different pages whose short hashes collide get a longer
hash. The tree is stored as parent links beside ``source_ids``; roots are kept
in time order, which is the order of the Linear_Flow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from operator import attrgetter
from typing import Any

import msgspec

from .logical import ConsolidatedPage, Origin, Page, short_hash

__all__ = ["Activation", "PageIndex", "PageState", "UnknownPage"]

HEAT_DECAY = 0.5


_FIRST_TURN = attrgetter("first_turn")


def _in_time(page: Page) -> tuple[bool, int]:
    """Time order with memory: a conversation's pages by their place in it; pages from memory (Storage)
    before them, in the order they were registered (the memory Router's: a conversation's pages together)."""
    return (True, page.first_turn) if page.origin == Origin.HISTORY else (False, 0)


class Activation(StrEnum):
    HOT = "Hot"  # injected with its content
    INDEXED = "Indexed"  # present by its summary
    SHELVED = "Shelved"  # registered, not in the horizon


class PageState(msgspec.Struct, frozen=True):
    """A page's state at the end of a request (§5.3): what it was, how warm, how long since it was touched."""

    activation: Activation
    heat: float
    staleness: int


class UnknownPage(KeyError):
    def __str__(self) -> str:
        return f"no page with id {self.args[0]!r}"


class PageIndex:
    """The tree of one request's pages, and their state in that request.

    The tree is three maps: pages by id, each child's container, and Topic
    IDs. The state (heat, staleness, activation) is kept only for the pages a
    request touched: the rest are Indexed, cold, and as stale as the clock.
    """

    def __init__(self) -> None:
        self.pages: dict[str, Page] = {}
        self.parents: dict[str, str] = {}  # child id -> its container's id
        self.topics: dict[str, str] = {}
        self._roots: dict[str, None] = {}  # insertion order breaks ties in time
        self._ordered: list[str] | None = []  # the roots in time order, once asked for
        self.clock = 0  # rounds seen; staleness is measured in it
        self.heat: dict[str, float] = {}
        self.touched: dict[str, int] = {}  # the round each page was last touched in
        self.activations: dict[str, Activation] = {}
        self._order: Callable[[Page], Any] = _FIRST_TURN  # ``_in_time`` once a memory page joins

    @classmethod
    def of_tree(cls, pages: Sequence[Page], topics: Mapping[str, str]) -> PageIndex:
        """The index of a whole tree (children before their containers), each page registered as ``register`` would.

        Built in bulk: a long history's thousands of pages come back on every
        request.
        """
        index = cls()
        index.pages = {page.id: page for page in pages}
        if len(index.pages) < len(pages):  # ids that collide: one at a time, as register settles them
            index.pages = {}
            for page in pages:
                index.register(page, topics.get(page.id, ""))
            return index
        index.parents = {child: page.id for page in pages if isinstance(page, ConsolidatedPage) for child in page.source_ids}
        index.topics = dict(topics)
        index._roots = dict.fromkeys(page_id for page_id in index.pages if page_id not in index.parents)
        index._ordered = None
        return index

    @property
    def roots(self) -> list[str]:
        """Pages without a container, in time order (the order of the Linear_Flow)."""
        if self._ordered is None:
            key = self._order
            self._ordered = sorted(self._roots, key=lambda pid: key(self.pages[pid]))
        return self._ordered

    def __contains__(self, page_id: object) -> bool:
        return page_id in self.pages

    def __len__(self) -> int:
        return len(self.pages)

    def __iter__(self) -> Iterator[Page]:
        return iter(self.pages.values())

    # -- registration ----------------------------------------------------------
    def register(self, page: Page, topic: str = "") -> Page:
        """Add a page (children before their container); returns it with its final id."""
        existing = self.pages.get(page.id)
        if existing is not None:
            if _same(existing, page):
                return existing
            page = msgspec.structs.replace(page, id=self._unique_id(page))
        self.pages[page.id] = page
        if page.origin != Origin.HISTORY:
            self._order = _in_time
        if topic:
            self.topics[page.id] = topic
        if isinstance(page, ConsolidatedPage):
            for child in page.source_ids:
                self.parents[child] = page.id
                self._roots.pop(child, None)
        if page.id not in self.parents:  # a memory page may come after its container (a page fault)
            self._roots[page.id] = None
        self._ordered = None  # sorting once per read, not per page, keeps registering linear
        return page

    def _unique_id(self, page: Page) -> str:
        """A longer id for ``page``, which no page of the index holds yet."""
        length = len(page.id)
        while True:
            length += 2
            candidate = short_hash(page.summary, repr(page), length=length)
            if candidate not in self.pages:
                return candidate

    # -- reading -------------------------------------------------------------
    def get(self, page_id: str) -> Page:
        """The page ``page_id``; ``UnknownPage`` if the index has none."""
        try:
            return self.pages[page_id]
        except KeyError:
            raise UnknownPage(page_id) from None

    def topic(self, page_id: str) -> str:
        """The Topic ID of a topic group (first-level container); "" for other pages."""
        self.get(page_id)
        return self.topics.get(page_id, "")

    def children(self, page_id: str) -> list[Page]:
        """The children of ``page_id`` the index holds, in order."""
        page = self.get(page_id)
        # A memory container's children join the index when it is opened (a page fault): those not in yet are not shown.
        return [self.pages[c] for c in page.source_ids if c in self.pages] if isinstance(page, ConsolidatedPage) else []

    def parent(self, page_id: str) -> str | None:
        """The id of the container ``page_id`` is in (None for a root)."""
        self.get(page_id)
        return self.parents.get(page_id)

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
        if page_ids is None:  # every Original page is under a root
            return sorted((page for page in self.pages.values() if not isinstance(page, ConsolidatedPage)), key=self._order)
        found: list[Page] = []
        self._collect(page_ids, found)
        return sorted(found, key=self._order)

    def _collect(self, page_ids: Iterable[str], into: list[Page]) -> None:
        """Append the leaves under ``page_ids`` to ``into``, depth first."""
        for page_id in page_ids:
            page = self.pages.get(page_id)
            if page is None:  # a memory page not faulted in
                continue
            if isinstance(page, ConsolidatedPage):
                self._collect(page.source_ids, into)
            else:
                into.append(page)

    # -- heat and staleness ----------------------------------------------------
    def touch(self, page_id: str, heat: float = 1.0) -> None:
        """Warm ``page_id`` by ``heat``, and mark it used now."""
        self.get(page_id)
        self.heat[page_id] = self.heat.get(page_id, 0.0) + heat
        self.touched[page_id] = self.clock

    def tick(self) -> None:
        """End of a round: heat decays, staleness grows."""
        self.clock += 1
        self.heat = {page_id: heat * HEAT_DECAY for page_id, heat in self.heat.items()}

    def staleness(self, page_id: str) -> int:
        """How many rounds since ``page_id`` was last used."""
        self.get(page_id)
        return self.clock - self.touched.get(page_id, 0)

    def activation(self, page_id: str) -> Activation:
        """How ``page_id`` is active: Indexed unless it was made Hot or Shelved."""
        self.get(page_id)
        return self.activations.get(page_id, Activation.INDEXED)

    def activate(self, page_id: str, activation: Activation) -> None:
        """Set how ``page_id`` is active."""
        self.get(page_id)
        self.activations[page_id] = activation

    def states(self) -> dict[str, PageState]:
        """The state of every page this request touched or activated."""
        return {p: PageState(self.activation(p), self.heat.get(p, 0.0), self.staleness(p)) for p in {**self.touched, **self.activations}}


def _same(a: Page, b: Page) -> bool:
    """Whether two pages are the same, their depth aside."""
    return type(a) is type(b) and msgspec.structs.replace(a, depth=b.depth) == b
