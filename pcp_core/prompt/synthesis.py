"""Synthesis (§IX) and Overflow Governance (§III.2): the ``<PagedContext>`` under a token budget.

What the worker sees is decided greedily, cheapest guarantee first:

1. what every call carries — the instructions, the client's head, the query,
   the trace — clipped only if it alone exceeds the budget; the client's first
   message, as sent, within a quarter of the budget with the head;
2. every root starts folded into ``<Background_Context>`` (one line each, with
   its id, so the worker can still Consult it);
3. pages are admitted in the caller's priority order (the engine's: what the
   worker consulted, the best Hot pages, the roots' Summaries for an overview —
   within its share of the budget, the first root always —, the other Hot
   pages, the most recent turns). A page zoomed into by Consult is shown
   nested in its Unpacked ancestors, and costs their unfolding; a page the Router injected stands alone in the flow. A page
   that does not fit stays at Summary — that is the Detail → Summary
   dehydration;
4. remaining roots are unfolded to Summary nodes while they fit, newest first.

The prompt opens as the client's requests do: the head as the system message,
the first message opening the user message, both as sent (a provider's cache
finds the prefix the client's own requests left). The document follows it,
laid out what changes least first (``pcp_core.prompt.document``): the registry, the
overview and the latest closed pages (the frame a follow-up replays,
``pcp_core.prompt.frame``), the pages of this request, then the trace, the Query and
the time. With a frame, what is admitted comes after it, and at most
``fresh_tokens`` of it: that part is new to a provider's prompt cache.

Costs are counted per element and summed; the exact count of the final
messages is checked and the last admission undone while it is over budget.
"""

from __future__ import annotations

from typing import Any

from ..conversation import PLACEHOLDER, placeholder
from ..pages.index import PageIndex
from ..pages.logical import Origin, View
from ..text.tokens import CountText, clip_tokens, leading_tokens, part_tokens, prompt_tokens
from . import document
from .document import node_ends, node_places, node_starts
from .flow import Flow
from .frame import Shown
from .markup import background_line, node_lines
from .synthesis_types import Synthesis, SynthesisRequest

__all__ = ["synthesize"]

S, D, U = View.SUMMARY, View.DETAIL, View.UNPACKED


def synthesize(index: PageIndex, views: dict[str, View], request: SynthesisRequest, count: CountText) -> Synthesis:
    """The ``<PagedContext>`` messages for ``request``: the views admitted under its budget, laid out."""
    return _Builder(index, views, request, count).build()


class _Builder:
    def __init__(self, index: PageIndex, views: dict[str, View], request: SynthesisRequest, count: CountText):
        self.index, self.wanted, self.request, self.count = index, views, request, count
        self.overview: set[str] = set()  # the roots shown for the overview: with the latest closed pages, the next frame
        self.flow = Flow(index, views, request, count, self.overview)
        self.costs: dict[tuple[str, View, bool], int] = {}
        self.consulted = set(request.consulted)
        self.query_parts = self._fit_query_parts()

    # -- the plan ---------------------------------------------------------------
    def build(self) -> Synthesis:
        """Admit pages greedily under the budget, then undo the last admissions while the exact count is over."""
        request, frame = self.request, self.request.frame
        head, opening, query = self._fit_fixed()
        used = self._exact(self.flow.document(head, opening, query, {}, set()), head)  # every root folded; with a frame, the frame alone
        if frame is not None and used + request.frame_room > request.budget:
            return Synthesis(messages=[], tokens=0, shown={}, standalone=[], folded=[], dehydrated=[], overflow=True)
        shown: dict[str, View] = {}  # admitted views of non-root-Summary pages
        unfolded: set[str] = set()  # roots shown in the Linear_Flow
        admissions: list[tuple[dict[str, View], set[str]]] = []
        indexed = set(request.indexed)
        fresh_left = request.budget if request.fresh_tokens is None else request.fresh_tokens
        zone_left = request.budget if request.frame_budget is None else request.frame_budget
        self.overview.clear()

        def admit(views: dict[str, View], roots: set[str]) -> bool:
            """Show ``views`` and ``roots`` if they fit the budget and their share of it."""
            nonlocal used, fresh_left, zone_left
            delta = self._delta(shown, unfolded, views, roots)
            fresh = not self._frame_zone(views, roots)
            if used + delta > request.budget or delta > (fresh_left if fresh else zone_left):
                return False
            used += delta
            fresh_left -= delta if fresh else 0
            zone_left -= 0 if fresh else delta
            shown.update(views)
            unfolded.update(roots)
            admissions.append((views, roots))
            return True

        overview_left = request.budget if request.overview_budget is None else request.overview_budget
        overview_shown = False
        for page_id in dict.fromkeys(request.priorities):
            if page_id in self.index and self.wanted.get(page_id, S) != S:
                if self._in_frame(page_id, self.wanted[page_id]):
                    continue
                views, roots = self._raise_plan(page_id, self.wanted[page_id], shown)
                if not admit(views, roots) and not roots and page_id not in shown and not self._in_frame(page_id, S):
                    admit({page_id: S}, set())  # Dynamic Dehydration (§III.2): its Summary, where its Detail does not fit
            elif page_id in self.index.roots and page_id not in unfolded and frame is None:
                # A root listed for itself: its Summary, while the overview's share lasts (with a frame: the frame's).
                cost = self._delta(shown, unfolded, {}, {page_id})
                self.overview.add(page_id)
                if (cost <= overview_left or not overview_shown) and admit({}, {page_id}):
                    overview_left -= cost
                    overview_shown = True
                else:
                    self.overview.discard(page_id)
            elif page_id in indexed and page_id not in shown and page_id in self.index and not self._in_frame(page_id, S):
                admit({page_id: S}, set())  # standalone at Summary
        for root in reversed(self.index.roots if frame is None else ()):
            if root not in unfolded:
                admit({}, {root})

        while True:
            text = self.flow.document(head, opening, query, shown, unfolded)
            messages = self.flow.messages(text, head, self._attached(shown))
            tokens = prompt_tokens(messages, self.count) + request.reserved_tokens
            if tokens <= request.budget or not admissions:
                break
            views, roots = admissions.pop()  # the estimate was short: undo the least important
            for page_id in views:
                shown.pop(page_id, None)
            unfolded.difference_update(roots)
        return self._result(text, messages, tokens, shown, unfolded, start=len(self.flow.registry(head, opening)))

    def _result(self, text: str, messages: list[dict[str, Any]], tokens: int, shown: dict[str, View], unfolded: set[str], start: int) -> Synthesis:
        """The synthesis of ``text``, whose flow (a frame replayed, or the one it makes) begins at ``start``."""
        frame = self.request.frame
        layout = self.flow.layout(shown, unfolded)
        made = [p for p in layout if self.flow.place(p, shown, unfolded)[0] < 2] if frame is None else []  # the next frame's nodes
        if frame is not None:
            frame_text, frame_shown = frame.text, frame.shown
        else:
            frame_text = self.flow.background(unfolded) + document.FLOW_OPEN + self.flow.nodes(made, shown)
            frame_shown = {p: shown.get(p, S) for p in made}
        lines = node_places(text, layout, start + len(frame_text) if frame is not None else start)
        ends = node_ends(text, lines)
        views = {**{r: S for r in unfolded}, **shown}
        after = [Shown(p, views[p], text[a:b]) for p, a, b in list(zip(layout, lines, ends))[len(made) :] if p != self.request.last]
        folded = [r for r in self.flow.listed() if r not in unfolded and (frame is None or r not in frame.shown)]
        return Synthesis(
            messages=messages, tokens=tokens, shown={**{r: S for r in unfolded}, **shown}, standalone=[p for p in shown if self.flow.detached(p, shown)],
            folded=folded, dehydrated=[p for p, v in self.wanted.items() if v != S and shown.get(p, S) != v], layout=layout,
            starts=node_starts(text, lines, self.count), ends=ends, frame_text=frame_text, frame_shown=frame_shown,
            frame_end=start + len(frame_text), after=after,
        )  # fmt: skip

    def _frame_zone(self, views: dict[str, View], roots: set[str]) -> bool:
        """Whether an admission is of what makes the next frame (no frame replayed): the overview's roots, the latest closed pages."""
        if self.request.frame is not None:
            return False
        zone = set(self.request.frame_pages)
        return roots <= self.overview and all(view == D and page_id in zone for page_id, view in views.items())

    def _in_frame(self, page_id: str, view: View) -> bool:
        """Whether the frame replayed shows ``page_id`` at ``view`` or above."""
        frame = self.request.frame
        shown = frame.shown.get(page_id) if frame is not None else None
        return shown is not None and _RANK[shown] >= _RANK[view]

    def _raise_plan(self, page_id: str, view: View, shown: dict[str, View]) -> tuple[dict[str, View], set[str]]:
        """The views and the root needed to show ``page_id`` at ``view``.

        A page zoomed into (its ancestors wanted Unpacked) is shown nested in
        them; a page the Router injected directly stands alone in the flow.
        """
        chain = self.index.ancestors(page_id)
        if not all(self.wanted.get(a) == U for a in chain):
            return ({page_id: view} if shown.get(page_id, S) != view else {}), set()
        views = {a: U for a in chain if shown.get(a) != U}
        if shown.get(page_id, S) != view:
            views[page_id] = view
        return views, {chain[-1] if chain else page_id}

    def _delta(self, shown: dict[str, View], unfolded: set[str], views: dict[str, View], roots: set[str]) -> int:
        """Extra tokens if ``views`` and ``roots`` were added to what is shown."""
        delta = 0
        for root in roots - unfolded:
            delta += self._cost(root, S, nested=False) - self._line_cost(root)
        for page_id, view in views.items():
            if self.flow.detached(page_id, {**shown, **views}):
                delta += self._cost(page_id, view, nested=False) - (self._cost(page_id, shown[page_id], nested=False) if page_id in shown else 0)
                continue
            nested = self.index.parent(page_id) is not None
            delta += self._cost(page_id, view, nested) - self._cost(page_id, shown.get(page_id, S), nested)
            if view == U and shown.get(page_id) != U:
                delta += sum(self._cost(c.id, S, nested=True) for c in self.index.children(page_id) if c.id not in views)
        return delta

    # -- costs -------------------------------------------------------------------
    def _cost(self, page_id: str, view: View, nested: bool) -> int:
        """A node's lines, and the parts it brings to the user message."""
        key = (page_id, view, nested)
        if key not in self.costs:
            parts = self._page_parts(page_id) if view == D else []
            self.costs[key] = self.count(node_lines(self.index.get(page_id), view, nested)) + sum(self.count(placeholder(p)) + part_tokens(p) for p in parts)
        return self.costs[key]

    def _page_parts(self, page_id: str) -> list[Any]:
        """The parts a page shown in Detail brings: those its placeholders name, once the worker asked for the page."""
        if page_id not in self.consulted or not self.request.parts:
            return []
        page = self.index.get(page_id)
        handles = PLACEHOLDER.findall(page.content or page.summary)
        return [self.request.parts[h] for h in dict.fromkeys(handles) if h in self.request.parts]

    def _attached(self, shown: dict[str, View]) -> list[Any]:
        """The parts the user message carries: the query's, then those of the pages shown in Detail."""
        pages = [part for page_id, view in shown.items() if view == D for part in self._page_parts(page_id)]
        return [*self.query_parts, *{placeholder(p): p for p in pages if p not in self.query_parts}.values()]

    def _fit_query_parts(self) -> list[Any]:
        """The query's parts, in order, as many as fit in the budget with the frame and the query's text:
        they are the query's as its text is, and the history gets what they leave."""
        parts, request = list(self.request.query_parts), self.request
        frame = self.flow.document("", "", request.query, {}, set())
        while parts and prompt_tokens(self.flow.messages(frame, "", parts), self.count) + request.reserved_tokens > request.budget:
            parts.pop()
        return parts

    def _line_cost(self, root: str) -> int:
        """What a root's line in Background_Context costs, which showing the root saves (none with a frame: its background stays)."""
        page = self.index.get(root)
        return self.count(background_line(page)) + 1 if page.origin == Origin.HISTORY and self.request.frame is None else 0

    def _exact(self, document: str, head: str) -> int:
        """The exact prompt tokens of ``document`` with ``head``."""
        return prompt_tokens(self.flow.messages(document, head, self.query_parts), self.count) + self.request.reserved_tokens

    def _fit_fixed(self) -> tuple[str, str, str]:
        """Clip the client's head (unless it is carried on top of the budget: then it goes whole), then the query,
        if what every call carries would not fit alone; and the opening to what a quarter of the budget leaves
        beside the head (of the budget on top of a carried head)."""
        request = self.request
        head, query = request.head, request.query
        spare = request.budget - self._exact(self.flow.document("", "", "", {}, set()), "") - 8
        head_cost, query_cost = self.count(head), self.count(query)
        if head_cost + query_cost > spare:
            if head_cost > spare // 4 and not request.carried:
                head = clip_tokens(head, max(spare // 4, 0), self.count)
                head_cost = self.count(head)
            query = clip_tokens(query, max(spare - head_cost, 0), self.count)
            query_cost = self.count(query)
        if request.carried:
            room = min((request.budget - request.carried) // 4, spare - query_cost - head_cost)
        else:
            room = min(request.budget // 4, spare - query_cost) - head_cost
        return head, leading_tokens(request.opening, room, self.count), query


_RANK = {S: 0, D: 1, U: 2}
