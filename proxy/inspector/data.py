"""What the inspector and ``pcp-proxy sessions`` show of a session: a summary, and its page tree.

Plain values built from a stored ``Session``; no I/O here, so the API and the
CLI show the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pcp_core import ConsolidatedPage, CountText, Session

from ..protocol.telemetry import RequestTrace

__all__ = ["TreePage", "bill_totals", "page_tree", "session_summary"]


class TreePage(msgspec.Struct, kw_only=True):
    """One page of a session's tree, as the inspector draws it."""

    id: str
    type: str  # Original | Consolidated
    parent: str | None
    children: list[str]
    timestamp: str
    turns: tuple[int, int]  # the first and last message it covers (-1: a File block's draft)
    topic: str  # the Topic ID of a topic group ("" for other pages)
    keywords: tuple[str, ...]
    summary: str
    tokens: int  # its text's; a container's, the sum of the pages below it
    draft: bool = False  # a Draft page of a File block


def session_summary(session: Session, traced: int = 0) -> dict[str, Any]:
    """A session in a line: its size, its dates, how many of its requests are traced."""
    pages = session.pages
    stamps = [leaf.timestamp for leaf in pages.leaves if leaf.timestamp]
    return {
        "id": session.id,
        "messages": len(session.chain),
        "turns": pages.turns,
        "originals": len(pages.leaves),
        "consolidated": len(pages.containers),
        "blocks": len(pages.blocks),
        "first": min(stamps, default=""),
        "last": max(stamps, default=""),
        "last_seen": session.seen_at[-1] if session.seen_at else "",
        "requests": traced,
    }


def bill_totals(traces: Sequence[RequestTrace]) -> dict[str, Any]:
    """A session's bill over its traced requests, beside what the same requests sent untouched would have been.

    ``paged``: every request as sent (its worker calls, ``rounds``); ``compared``: the same over the requests that
    could have gone untouched (they fit the model's window), ``untouched`` their bill sent untouched (one call
    each), and ``saved`` the sum of their savings. A request larger than the window is billed, never compared.
    """
    comparable = [trace for trace in traces if trace.untouched_fits]

    def paged(of: Sequence[RequestTrace]) -> dict[str, Any]:
        return {
            "requests": len(of),
            "rounds": sum(len(t.rounds) for t in of),
            "cached": sum(t.cached for t in of),
            "uncached": sum(t.uncached for t in of),
            "billed": sum(t.billed for t in of),
        }

    untouched = {
        "requests": len(comparable),
        "rounds": len(comparable),
        "cached": sum(t.untouched_cached for t in comparable),
        "uncached": sum(t.untouched_uncached for t in comparable),
        "billed": sum(t.untouched for t in comparable),
    }
    return {
        "paged": paged(traces),
        "compared": paged(comparable),
        "untouched": untouched,
        "saved": sum(t.tokens_saved for t in comparable),
        "not_comparable": len(traces) - len(comparable),
    }


def page_tree(session: Session, count: CountText) -> tuple[list[str], list[TreePage]]:
    """The roots (in time order) and every page of the session's tree, children before their container."""
    index = session.pages.index()
    tokens: dict[str, int] = {}
    out: list[TreePage] = []
    for page in _bottom_up(index.pages, index.roots, index.children):
        kids = [child.id for child in index.children(page.id)]
        if isinstance(page, ConsolidatedPage):
            tokens[page.id] = sum(tokens.get(kid, 0) for kid in kids)
        else:
            tokens[page.id] = count(page.content or page.summary)
        out.append(TreePage(
            id=page.id, type="Consolidated" if isinstance(page, ConsolidatedPage) else "Original", parent=index.parents.get(page.id),
            children=kids, timestamp=page.timestamp, turns=(page.first_turn, page.last_turn), topic=index.topics.get(page.id, ""),
            keywords=page.keywords, summary=page.summary, tokens=tokens[page.id], draft=page.draft,
        ))  # fmt: skip
    return list(index.roots), out


def _bottom_up(pages: dict[str, Any], roots: list[str], children: Any) -> list[Any]:
    """Every page under ``roots``, each after the pages inside it (iteratively: trees can be deep)."""
    ordered: list[Any] = []
    stack: list[tuple[str, bool]] = [(root, False) for root in reversed(roots)]
    seen: set[str] = set()
    while stack:
        page_id, expanded = stack.pop()
        if expanded:
            ordered.append(pages[page_id])
            continue
        if page_id in seen:
            continue
        seen.add(page_id)
        stack.append((page_id, True))
        stack.extend((child.id, False) for child in reversed(children(page_id)))
    return ordered
