"""Forgetting (P-Mem §3.2, negative weighting): which pages go, and what is left of the tree above them.

A forgotten page takes its subtree with it. Memory keeps a hash of every
turn of the Originals that go (``pcp_core.memory.turn_hash``), so a
conversation sent again never writes them back. The containers above are
consolidated again from the children left (their summaries quoted what
went), and one left with fewer than two children goes too, its last child
becoming a root.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pcp_core import ConsolidatedPage, OriginalPage, Page, PagingPolicy
from pcp_core.memory import page_turns, rebuilt, turn_hash, turn_hashes, without_turns
from pcp_core.pages.logical import without_turn_markers
from pcp_core.ranking.bm25 import stem
from pcp_core.text.terms import TermStats, terms

from .store import MemoryStore

__all__ = ["Plan", "forget_ids", "forget_query", "holds_all"]

_SCAN = 2000  # pages read at a time when a query is matched against a whole scope


class Plan(NamedTuple):
    """What forgetting does: the pages removed, the pages rewritten in place, the turns kept out from now on."""

    removed: list[str]
    rewritten: list[Page]
    hashes: set[str]


def forget_ids(
    store: MemoryStore, scope: str, ids: Sequence[str], paging: PagingPolicy = PagingPolicy(), stripped: Sequence[Page] = (), hashes: Iterable[str] = ()
) -> Plan:
    """Remove ``ids`` with their subtrees; ``stripped`` Originals lost some turns (``hashes``) and are rewritten.
    The containers above either are consolidated again from what is left or, left with one child, go too."""
    removed: dict[str, Page] = {}
    frontier = list(dict.fromkeys(ids))
    while frontier:
        pages = store.pages(scope, frontier)
        removed.update((p.id, p) for p in pages)
        frontier = [c for p in pages if isinstance(p, ConsolidatedPage) for c in p.source_ids if c not in removed]
    forgotten = turn_hashes(removed.values()) | set(hashes)
    rewritten: dict[str, Page] = {p.id: p for p in stripped}
    level = [*removed, *rewritten]
    while level:
        above = {parent for parents in store.parents(scope, level).values() for parent in parents if parent not in removed}
        level = []
        for parent_id in sorted(above):
            parent = rewritten.get(parent_id) or next(iter(store.pages(scope, [parent_id])), None)
            if not isinstance(parent, ConsolidatedPage):
                continue
            kept = [c for c in parent.source_ids if c not in removed]
            children = [rewritten.get(p.id, p) for p in store.pages(scope, kept)]
            if len(children) < 2:
                removed[parent_id] = parent
                rewritten.pop(parent_id, None)
            else:
                stats = TermStats([c.content or c.summary for c in children])
                rewritten[parent_id] = rebuilt(parent, children, stats, paging)
            level.append(parent_id)
    return Plan(list(removed), list(rewritten.values()), forgotten)


def forget_query(store: MemoryStore, scope: str, query: str, paging: PagingPolicy = PagingPolicy()) -> Plan:
    """Forget the turns that hold every term of ``query`` (the whole scope is read): a page left without turns goes,
    one that keeps some is rewritten without them."""
    wanted = {stem(t) for t in terms(query)}
    removed: list[str] = []
    stripped: list[Page] = []
    hashes: set[str] = set()
    after = 0
    while wanted:
        batch = store.listing(scope, after, _SCAN)
        if not batch:
            break
        for page in (s.page for s in batch if isinstance(s.page, OriginalPage)):
            matching = {turn_hash(turn) for turn in page_turns(page.content) if holds_all(turn, wanted)}
            if matching:
                hashes |= matching
                kept = without_turns(page, matching, TermStats([page.content]), paging)
                removed.append(page.id) if kept is None else stripped.append(kept)
        after = batch[-1].row
    return forget_ids(store, scope, removed, paging, stripped, hashes)


def holds_all(turn: str, wanted: set[str]) -> bool:
    """Whether ``turn`` holds every one of the ``wanted`` stems."""
    return wanted <= {stem(t) for t in terms(without_turn_markers(turn))}
