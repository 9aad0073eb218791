"""Zooming (§VI.3–4): what a directive does to the views, and the pages reactive diffusion brings in beside it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..pages.index import Activation, PageIndex, UnknownPage
from ..pages.logical import ConsolidatedPage, View
from ..pages.views import ViewState
from ..prompt.synthesis_types import Step
from .vocabulary import Consult, Directive, Explore, Shelve

__all__ = ["carry_out", "diffuse", "still_raised"]


def still_raised(page_ids: list[str], views: ViewState) -> list[str]:
    """``page_ids`` without repeats, less those a directive folded back to Summary."""
    return [p for p in dict.fromkeys(page_ids) if views.view(p) != View.SUMMARY]


def carry_out(
    directive: Directive,
    views: ViewState,
    index: PageIndex,
    explore: Callable[[Sequence[str]], list[str]],
    round_no: int,
    standalone: set[str],
    hits: int = 3,
) -> tuple[Step, list[str]]:
    """Carry out one directive; returns its trace step and the pages it raised."""
    name = type(directive).__name__
    target = directive.handle if isinstance(directive, Explore) else directive.id
    try:
        if isinstance(directive, Consult):
            # A page shown on its own zooms in place; any other opens its path (§7.2).
            changes = views.consult(directive.id, round_no, unfold=directive.id not in standalone)
            index.touch(directive.id)
            return _step(name, target, directive.reason, changes), [directive.id]
        if isinstance(directive, Shelve):
            changes = views.shelve(directive.id, round_no)
            index.activate(directive.id, Activation.SHELVED)
            return _step(name, target, directive.reason, changes), []
        scope = None if directive.handle in ("history", "") else _subtree(index, directive.handle)
        found = [p for p in explore(directive.keywords) if scope is None or p in scope][:hits]
        for page_id in found:
            views.raise_to(page_id, View.DETAIL, round_no, unfold=False)
            index.touch(page_id)
        return Step(name, target, directive.reason, f"found {', '.join(found) or 'nothing'}"), found
    except UnknownPage as missing:
        return Step("BusFault", target, f"{name}: {missing}; use an id shown in the PagedContext"), []


def diffuse(directive: Directive, ranked: list[str], index: PageIndex, views: ViewState, round_no: int, read: set[str], pages: int = 3) -> list[str]:
    """Reactive diffusion (§VI.4): zooming into a container re-addresses inside it.

    The Original pages under the consulted container that rank best for the
    intent, and that the worker has not been shown in Detail in any round
    (``read``), are injected in Detail beside it — so a Consult on a summary
    reaches new evidence, not only another summary or pages already read.
    """
    if not isinstance(directive, Consult) or directive.id not in index or not isinstance(index.get(directive.id), ConsolidatedPage):
        return []
    scope = _subtree(index, directive.id)
    found = [p for p in ranked if p in scope and p not in read][:pages]
    for page_id in found:
        views.raise_to(page_id, View.DETAIL, round_no, unfold=False)
        index.touch(page_id)
    return found


def _subtree(index: PageIndex, handle: str) -> set[str]:
    """The ids of the leaves under ``handle`` (the page itself when it has none)."""
    page = index.get(handle)
    if not isinstance(page, ConsolidatedPage):
        return {page.id}
    return {leaf.id for leaf in index.leaves([handle])}


def _step(action: str, target: str, reason: str, changes: Sequence[Any]) -> Step:
    """The trace's step for a directive, with the view changes it made."""
    result = "; ".join(f"{c.page_id} {c.before}→{c.after}" for c in changes) or "no change"
    return Step(action, target, reason, result)
