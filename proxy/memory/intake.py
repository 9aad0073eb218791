"""What a write-back keeps: its new pages judged against the scope (``pcp_core.memory.novelty``), on the writer thread.

Each new Original is weighed against the scope's pages most like it (the
keyword indexes' best matches, records too, the conversation's own earlier
pages aside). One that repeats a page the scope holds gives way to it: the
conversation claims that page rather than writing a copy. One that adds
nothing is written as a record. A new container all of whose pages are
records is a record too.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from pcp_core import ConsolidatedPage, Page
from pcp_core.memory import MemoryIntake, content_terms, novelty, repeats

from .search import ScopeIndex
from .store import MemoryStore

__all__ = ["Intake", "judged"]


class Intake(msgspec.Struct, frozen=True):
    """A write-back's pages as written: repeats replaced by the pages they repeat, and the new pages that are records."""

    pages: list[Page]
    records: frozenset[str] = frozenset()


def judged(store: MemoryStore, index: ScopeIndex, scope: str, conversation: str, pages: Sequence[Page], policy: MemoryIntake = MemoryIntake()) -> Intake:
    """What of ``pages`` the scope does not hold yet, each judged a page or a record by what it adds."""
    new = store.missing(scope, [p.id for p in pages])
    if not new:
        return Intake(list(pages))
    df, n = index.frequencies()
    below = {child for page in pages for child in getattr(page, "source_ids", ())}
    records: set[str] = set()
    held: dict[str, Page] = {}
    for page in pages:
        if page.id not in new or isinstance(page, ConsolidatedPage):
            continue
        rows = index.alike(content_terms(page), policy.neighbours)
        others = [s.page for s in store.stored(scope, rows) if s.conversation != conversation]
        same = repeats(page, others, df, n, policy) if page.id not in below else None  # a page in a container stays where it is
        if same is not None:
            held[page.id] = same
        elif novelty(page, [content_terms(other) for other in others], df, n) < policy.novel:
            records.add(page.id)
    for page in pages:  # bottom up: a container after its pages
        if page.id in new and isinstance(page, ConsolidatedPage) and page.source_ids and all(c in records for c in page.source_ids):
            records.add(page.id)
    return Intake([held.get(page.id, page) for page in pages], frozenset(records))
