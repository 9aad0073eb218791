"""Small builders shared by the pcp_core unit tests."""

from __future__ import annotations

from pcp_core.pages.index import PageIndex
from pcp_core.pages.logical import ConsolidatedPage, Origin, OriginalPage, short_hash


def op(text: str, turn: int, keywords: tuple[str, ...] = ()) -> OriginalPage:
    return OriginalPage(
        id=short_hash("op", text), origin=Origin.HISTORY, depth=2, timestamp=f"2026-01-01T00:00:{turn:02d}",
        keywords=keywords, summary=text[:40], content=text, first_turn=turn, last_turn=turn,
    )  # fmt: skip


def cp(children: list, keywords: tuple[str, ...] = ()) -> ConsolidatedPage:
    return ConsolidatedPage(
        id=short_hash("cp", *(c.id for c in children)), origin=Origin.HISTORY, depth=1, timestamp=children[0].timestamp,
        keywords=keywords, summary=" / ".join(c.summary for c in children), source_ids=tuple(c.id for c in children),
        content="\n".join(c.summary for c in children), first_turn=children[0].first_turn, last_turn=children[-1].last_turn,
    )  # fmt: skip


def two_level_tree() -> tuple[PageIndex, dict[str, str]]:
    """Roots A (over a1, a2) and B (over b1, b2); returns the index and name -> id."""
    index = PageIndex()
    a1, a2, b1, b2 = (op(f"page {name} text", i) for i, name in enumerate(["a1", "a2", "b1", "b2"]))
    for page in (a1, a2, b1, b2):
        index.register(page)
    a, b = cp([a1, a2]), cp([b1, b2])
    index.register(a)
    index.register(b)
    return index, {"a1": a1.id, "a2": a2.id, "b1": b1.id, "b2": b2.id, "A": a.id, "B": b.id}


def paged(messages) -> str:
    """The ``<PagedContext>`` of a worker prompt."""
    from pcp_core.prompt.document import paged_context
    from pcp_core.prompt.frame import prompt_text

    return paged_context(prompt_text(messages))
