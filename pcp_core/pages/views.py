"""The view-state machine (§7.1–7.4): Summary → Detail → Unpacked, and back.

The whole machine is the table below; everything else applies it and keeps the
tree consistent:

* Consult on a page hidden inside a folded container unfolds the path to it
  (its ancestors become Unpacked) — zooming straight to a known address.
* Active Zoom: an Unpacked container must show at least one child above
  Summary. A container unpacked in an earlier round whose children are all at
  Summary folds back to Detail; one unpacked this round gets that round to look
  inside.
* Cascading Shelve: shelving the last raised child of an Unpacked container
  folds the container to Detail at once (§7.4).
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from .index import PageIndex
from .logical import ConsolidatedPage, View

__all__ = ["Action", "TRANSITIONS", "Transition", "ViewState"]

S, D, U = View.SUMMARY, View.DETAIL, View.UNPACKED
RANK = {S: 0, D: 1, U: 2}


class Action(StrEnum):
    CONSULT = "Consult"
    SHELVE = "Shelve"


#   (action,          is container, from) -> to
TRANSITIONS: dict[tuple[Action, bool, View], View] = {
    (Action.CONSULT, False, S): D,  # Original: reveal content (Level 2)
    (Action.CONSULT, False, D): D,  # Original: the logical endpoint (Level 4)
    (Action.CONSULT, True, S): D,  # Consolidated: reveal the consolidated text
    (Action.CONSULT, True, D): U,  # Consolidated: nest the children (Level 3)
    (Action.CONSULT, True, U): U,
    (Action.SHELVE, False, S): S,
    (Action.SHELVE, False, D): S,
    (Action.SHELVE, True, S): S,
    (Action.SHELVE, True, D): S,
    (Action.SHELVE, True, U): D,
}


class Transition(msgspec.Struct, frozen=True):
    page_id: str
    before: View
    after: View


class ViewState:
    """The current view of every page; pages not listed are at Summary."""

    def __init__(self, index: PageIndex):
        self.index = index
        self.views: dict[str, View] = {}
        self.unpacked_in: dict[str, int] = {}  # container id -> round it was unpacked

    def view(self, page_id: str) -> View:
        """The view ``page_id`` is shown at (Summary unless raised)."""
        return self.views.get(page_id, S)

    def raised(self) -> dict[str, View]:
        """Pages above Summary, in the order their views last changed (synthesis lays a round's changes out after what it keeps)."""
        return dict(self.views)

    def consult(self, page_id: str, round_no: int = 0, *, unfold: bool = True) -> list[Transition]:
        """One level up; ``unfold=False`` zooms a page shown on its own without opening its path."""
        changes = self._unfold_path(page_id, round_no) if unfold else []
        changes.append(self._apply(Action.CONSULT, page_id, round_no))
        return [c for c in changes if c.before != c.after]

    def shelve(self, page_id: str, round_no: int = 0) -> list[Transition]:
        """Fold ``page_id`` one level, and its container too when none of its children stays raised."""
        changes = [self._apply(Action.SHELVE, page_id, round_no)]
        if self.view(page_id) == S:
            self._hide_subtree(page_id)
        # Cascading: a container left with no raised child folds upward.
        parent = self.index.parent(page_id)
        if parent is not None and self.view(parent) == U and not self._any_child_raised(parent):
            changes.append(self._set(parent, D, round_no))
        return [c for c in changes if c.before != c.after]

    def raise_to(self, page_id: str, view: View, round_no: int = 0, *, unfold: bool = True) -> list[Transition]:
        """Bring a page to at least ``view``; ``unfold=False`` injects it without opening its path (Router Hot pages)."""
        if view == U and not self._is_container(page_id):
            raise ValueError(f"only Consolidated pages can be Unpacked, not {page_id}")
        changes = self._unfold_path(page_id, round_no) if unfold else []
        if RANK[self.view(page_id)] < RANK[view]:
            changes.append(self._set(page_id, view, round_no))
        return [c for c in changes if c.before != c.after]

    def settle(self, round_no: int) -> list[Transition]:
        """Active Zoom at the end of a round: fold containers nobody looked inside."""
        changes = []
        for page_id, view in list(self.views.items()):
            if view == U and self.unpacked_in.get(page_id, round_no) < round_no and not self._any_child_raised(page_id):
                changes.append(self._set(page_id, D, round_no))
        return changes

    # -- internals -------------------------------------------------------------
    def _unfold_path(self, page_id: str, round_no: int) -> list[Transition]:
        """Unpack every ancestor of ``page_id`` that is not yet."""
        return [self._set(a, U, round_no) for a in reversed(self.index.ancestors(page_id)) if self.view(a) != U]

    def _apply(self, action: Action, page_id: str, round_no: int) -> Transition:
        """Apply ``action`` to ``page_id`` by the view-state machine's transitions."""
        before = self.view(page_id)
        return self._set(page_id, TRANSITIONS[(action, self._is_container(page_id), before)], round_no)

    def _set(self, page_id: str, view: View, round_no: int) -> Transition:
        """Show ``page_id`` at ``view``, and record the transition."""
        before = self.view(page_id)
        if view != before:
            self.views.pop(page_id, None)  # a page that changes goes to the end of the order
        if view != S:
            self.views[page_id] = view
        if view == U and before != U:
            self.unpacked_in[page_id] = round_no
        elif view != U:
            self.unpacked_in.pop(page_id, None)
        return Transition(page_id, before, view)

    def _is_container(self, page_id: str) -> bool:
        """Whether ``page_id`` is a Consolidated page."""
        return isinstance(self.index.get(page_id), ConsolidatedPage)

    def _any_child_raised(self, page_id: str) -> bool:
        """Whether any child of ``page_id`` is shown above Summary."""
        return any(self.view(child.id) != S for child in self.index.children(page_id))

    def _hide_subtree(self, page_id: str) -> None:
        """Fold every page under ``page_id`` back to Summary."""
        for child in self.index.children(page_id):
            self._set(child.id, S, 0)
            self._hide_subtree(child.id)
