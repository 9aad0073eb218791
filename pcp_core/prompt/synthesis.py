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

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec
from lxml import etree

from ..conversation import PLACEHOLDER, attached, placeholder
from ..pages.index import PageIndex
from ..pages.logical import Origin, View
from ..text.tokens import CountText, clip_tokens, leading_tokens, part_tokens, prompt_tokens
from . import document
from .document import FINAL_ROUND_INSTRUCTION, USER_LINE, node_ends, node_places, node_starts
from .frame import Frame, Shown
from .markup import background_line, node, node_lines

__all__ = ["Step", "Synthesis", "SynthesisRequest", "synthesize"]

S, D, U = View.SUMMARY, View.DETAIL, View.UNPACKED


class Step(msgspec.Struct, frozen=True):
    """One entry of the Reasoning_Trace."""

    action: str
    target: str
    reason: str
    result: str = ""


class SynthesisRequest(msgspec.Struct, kw_only=True):
    current_time: str
    query: str
    head: str = ""  # the client's system prompt: the prompt's system message, as sent
    # The client's first message: the user message opens with it as sent (up to a quarter of the budget with the head).
    opening: str = ""
    trace: Sequence[Step] = ()
    final: bool = False
    budget: int
    # Page ids to show, most important first: raised pages at their view, roots
    # at Summary, and ``indexed`` pages standalone at Summary.
    priorities: Sequence[str] = ()
    # The Router's Indexed pages (§VI.2): shown by their summary, addressable for Consult.
    indexed: Sequence[str] = ()
    # Tokens the call spends outside the messages (e.g. tool definitions).
    reserved_tokens: int = 0
    # Of ``budget``, the head's: the client's system prompt and tool definitions, which go whole (never clipped);
    # the opening's quarter is of what is left.
    carried: int = 0
    # Most tokens the roots listed in ``priorities`` may take as Summary nodes (None: no cap);
    # the first always shows. The rest stay folded in Background_Context, unless room is left at the end.
    overview_budget: int | None = None
    # Parts that are not text: the query's go to the worker with the user message (while they fit);
    # the history's, by handle, with it too in the rounds where a page the worker asked for
    # (``consulted``) shows their placeholders in Detail. Each counts ``tokens.part_tokens``.
    query_parts: Sequence[Any] = ()
    parts: Mapping[str, Any] = {}
    consulted: Sequence[str] = ()
    # Where the head goes: its own system message, or the user message's opening for upstreams that ignore system messages.
    context_role: Literal["system", "user"] = "system"
    ask_last: bool = False  # the user message ends with the query itself (``RoundPolicy.ask_last``)
    # Text after the document in the user message (the host's: Hybrid mode's snapshot), counted in the budget.
    appendix: str = ""
    # A follow-up's frame (``pcp_core.prompt.frame``), replayed as it is: what is admitted here comes after it.
    frame: Frame | None = None
    # Without a frame: the latest closed pages, laid out after the overview in Detail; with the
    # overview they make the frame the next request may replay (``Synthesis.frame_text``).
    frame_pages: Sequence[str] = ()
    # Most tokens the pages outside the frame may take (None: the budget's): what is new to a prompt cache.
    fresh_tokens: int | None = None
    # The least a replayed frame must leave for the rest (else nothing is admitted: ``Synthesis.overflow``).
    frame_room: int = 0
    # Without a frame: the most of the budget the next frame may take (the overview, the latest closed pages).
    frame_budget: int | None = None
    # The history's last page while it may still take the next turns: laid out last in the flow.
    last: str | None = None


class Synthesis(msgspec.Struct):
    messages: list[dict[str, Any]]
    tokens: int
    shown: dict[str, View]  # pages in the Linear_Flow and their materialized view
    standalone: list[str]  # pages shown outside their container (injected by the Router)
    folded: list[str]  # roots folded into Background_Context
    dehydrated: list[str]  # raised pages shown below their wanted view
    layout: list[str] = []  # the Linear_Flow's top-level nodes, in document order
    starts: list[int] = []  # the token at which each of them starts in the document
    ends: list[int] = []  # the character at which each of them ends in the document (where the next starts)
    frame_text: str = ""  # the document after its registry up to the end of the frame (made, or replayed)
    frame_shown: dict[str, View] = {}  # what the frame shows
    frame_end: int = 0  # the character at which the frame ends in the document
    overflow: bool = False  # the frame replayed leaves less room than ``fresh_tokens`` (nothing admitted)
    after: list[Shown] = []  # the top-level nodes after the frame, in order, the last page aside (``Frame.after``)

    def end_of(self, nodes: Sequence[str]) -> int | None:
        """Where the run of top-level nodes that opens the flow and is all of ``nodes`` ends in the document (None: no such run)."""
        wanted = set(nodes)
        run = 0
        while run < len(self.layout) and self.layout[run] in wanted:
            run += 1
        return self.ends[run - 1] if run else None


def synthesize(index: PageIndex, views: dict[str, View], request: SynthesisRequest, count: CountText) -> Synthesis:
    return _Builder(index, views, request, count).build()


class _Builder:
    def __init__(self, index: PageIndex, views: dict[str, View], request: SynthesisRequest, count: CountText):
        self.index, self.wanted, self.request, self.count = index, views, request, count
        self.overview: set[str] = set()
        self.costs: dict[tuple[str, View, bool], int] = {}
        self.consulted = set(request.consulted)
        self.query_parts = self._fit_query_parts()

    # -- the plan ---------------------------------------------------------------
    def build(self) -> Synthesis:
        request, frame = self.request, self.request.frame
        head, opening, query = self._fit_fixed()
        used = self._exact(self._document(head, opening, query, {}, set()), head)  # every root folded; with a frame, the frame alone
        if frame is not None and used + request.frame_room > request.budget:
            return Synthesis(messages=[], tokens=0, shown={}, standalone=[], folded=[], dehydrated=[], overflow=True)
        shown: dict[str, View] = {}  # admitted views of non-root-Summary pages
        unfolded: set[str] = set()  # roots shown in the Linear_Flow
        admissions: list[tuple[dict[str, View], set[str]]] = []
        indexed = set(request.indexed)
        fresh_left = request.budget if request.fresh_tokens is None else request.fresh_tokens
        zone_left = request.budget if request.frame_budget is None else request.frame_budget
        self.overview = set()  # the roots shown for the overview: with the latest closed pages, the next frame

        def admit(views: dict[str, View], roots: set[str]) -> bool:
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
            text = self._document(head, opening, query, shown, unfolded)
            messages = self._messages(text, head, self._attached(shown))
            tokens = prompt_tokens(messages, self.count) + request.reserved_tokens
            if tokens <= request.budget or not admissions:
                break
            views, roots = admissions.pop()  # the estimate was short: undo the least important
            for page_id in views:
                shown.pop(page_id, None)
            unfolded.difference_update(roots)
        return self._result(text, messages, tokens, shown, unfolded, start=len(self._registry(head, opening)))

    def _result(self, text: str, messages: list[dict[str, Any]], tokens: int, shown: dict[str, View], unfolded: set[str], start: int) -> Synthesis:
        """The synthesis of ``text``, whose flow (a frame replayed, or the one it makes) begins at ``start``."""
        frame = self.request.frame
        layout = self._layout(shown, unfolded)
        made = [p for p in layout if self._place(p, shown, unfolded)[0] < 2] if frame is None else []  # the next frame's nodes
        if frame is not None:
            frame_text, frame_shown = frame.text, frame.shown
        else:
            frame_text = self._background(unfolded) + document.FLOW_OPEN + self._nodes(made, shown)
            frame_shown = {p: shown.get(p, S) for p in made}
        lines = node_places(text, layout, start + len(frame_text) if frame is not None else start)
        ends = node_ends(text, lines)
        views = {**{r: S for r in unfolded}, **shown}
        after = [Shown(p, views[p], text[a:b]) for p, a, b in list(zip(layout, lines, ends))[len(made) :] if p != self.request.last]
        folded = [r for r in self._listed() if r not in unfolded and (frame is None or r not in frame.shown)]
        return Synthesis(
            messages=messages, tokens=tokens, shown={**{r: S for r in unfolded}, **shown}, standalone=[p for p in shown if self._detached(p, shown)],
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
            if self._detached(page_id, {**shown, **views}):
                delta += self._cost(page_id, view, nested=False) - (self._cost(page_id, shown[page_id], nested=False) if page_id in shown else 0)
                continue
            nested = self.index.parent(page_id) is not None
            delta += self._cost(page_id, view, nested) - self._cost(page_id, shown.get(page_id, S), nested)
            if view == U and shown.get(page_id) != U:
                delta += sum(self._cost(c.id, S, nested=True) for c in self.index.children(page_id) if c.id not in views)
        return delta

    def _detached(self, page_id: str, shown: dict[str, View]) -> bool:
        parent = self.index.parent(page_id)
        return parent is not None and shown.get(parent) != U

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
        pages = [part for page_id, view in shown.items() if view == D for part in self._page_parts(page_id)]
        return [*self.query_parts, *{placeholder(p): p for p in pages if p not in self.query_parts}.values()]

    def _fit_query_parts(self) -> list[Any]:
        """The query's parts, in order, as many as fit in the budget with the frame and the query's text:
        they are the query's as its text is, and the history gets what they leave."""
        parts, request = list(self.request.query_parts), self.request
        frame = self._document("", "", request.query, {}, set())
        while parts and prompt_tokens(self._messages(frame, "", parts), self.count) + request.reserved_tokens > request.budget:
            parts.pop()
        return parts

    def _line_cost(self, root: str) -> int:
        """What a root's line in Background_Context costs, which showing the root saves (none with a frame: its background stays)."""
        page = self.index.get(root)
        return self.count(background_line(page)) + 1 if page.origin == Origin.HISTORY and self.request.frame is None else 0

    def _listed(self) -> list[str]:
        """The roots Background_Context lists when they are folded: the conversation's.

        Memory's pages are a few of a store's many; those not shown are not
        part of what the worker can see, and cost it nothing.
        """
        return [root for root in self.index.roots if self.index.get(root).origin == Origin.HISTORY]

    def _exact(self, document: str, head: str) -> int:
        return prompt_tokens(self._messages(document, head, self.query_parts), self.count) + self.request.reserved_tokens

    def _fit_fixed(self) -> tuple[str, str, str]:
        """Clip the client's head (unless it is carried on top of the budget: then it goes whole), then the query,
        if what every call carries would not fit alone; and the opening to what a quarter of the budget leaves
        beside the head (of the budget on top of a carried head)."""
        request = self.request
        head, query = request.head, request.query
        spare = request.budget - self._exact(self._document("", "", "", {}, set()), "") - 8
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

    # -- rendering -----------------------------------------------------------------
    def _messages(self, text: str, head: str, parts: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """``head`` as the system message, as the client sent it (with ``context_role`` "user", ``text`` leads with it); the user message: ``text`` (the opening and the
        document), the host's appendix, the user line. A provider's cache finds the prefix the client's own
        requests made (the head, the first message) and, after it, what the previous call's document shares."""
        line = f"{USER_LINE} {FINAL_ROUND_INSTRUCTION}" if self.request.final else USER_LINE
        if self.request.ask_last:  # at most an eighth of the budget: the query shows whole in the document
            line = clip_tokens(self.request.query, self.request.budget // 8, self.count)
        said = f"{text}\n\n{self.request.appendix}\n\n{line}" if self.request.appendix else f"{text}\n\n{line}"
        user = {"role": "user", "content": attached(said, parts)}
        return [{"role": "system", "content": head}, user] if head and self.request.context_role == "system" else [user]

    def _document(self, head: str, opening: str, query: str, shown: dict[str, View], unfolded: set[str]) -> str:
        """The user message's text up to its appendix: what leads it (the head, for an upstream that ignores system
        messages; the opening), then the document (``pcp_core.prompt.document``): the registry; the frame replayed, or the
        roots folded into Background_Context and the flow's head; the flow's other nodes (``_layout``); what is new
        with the call. Offsets in a synthesis are in this text."""
        request, frame = self.request, self.request.frame
        nodes = self._nodes(self._layout(shown, unfolded), shown)
        flow = frame.text + nodes if frame is not None else self._background(unfolded) + document.FLOW_OPEN + nodes
        return self._registry(head, opening) + flow + document.FLOW_CLOSE + document.tail(request.trace, query, request.current_time, request.final)

    def _registry(self, head: str, opening: str) -> str:
        """The user message's text up to the end of the document's registry: what leads it, then the registry."""
        lead = "".join(f"{text}\n\n" for text in (head if self.request.context_role == "user" else "", opening) if text)
        return lead + document.registry(bool(self.request.parts))

    def _background(self, unfolded: set[str]) -> str:
        return document.background([self.index.get(r) for r in self._listed() if r not in unfolded])

    def _nodes(self, layout: Sequence[str], shown: dict[str, View]) -> str:
        return "".join(document.element_text(self._subtree(page_id, shown, nested=False)) for page_id in layout)

    def _layout(self, shown: dict[str, View], unfolded: set[str]) -> list[str]:
        """The Linear_Flow's top-level nodes (after the frame, when one is replayed), in the order that changes least.

        Without a frame: first the overview (the conversation's roots shown by
        their Summary) and the latest closed pages, in time order: what the next
        request's frame holds. Then the nodes the views raised, by when they
        last changed (a subtree by the latest change inside it), so a round's
        new pages come after those it kept, and what Overflow Governance drops
        for them is the tail of the Router's order; then the other roots shown
        by their Summary (memory's containers); last the Router's Indexed pages.
        Each node carries its timestamp, so time order is still there to read.
        """
        tops = [p for p in self.index.roots if p in unfolded] + [p for p in shown if self._detached(p, shown)]
        return sorted(tops, key=lambda page_id: self._place(page_id, shown, unfolded))

    def _place(self, page_id: str, shown: dict[str, View], unfolded: set[str]) -> tuple[int, int]:
        """Where a top-level node goes: (its part of the flow, its order in it); parts 0 and 1 make the next frame."""
        page = self.index.get(page_id)
        if page_id == self.request.last:
            return 5, 0
        if self.request.frame is None and page_id in self.overview and page_id not in shown:
            return 0, page.first_turn
        if self.request.frame is None and page_id in self.request.frame_pages and shown.get(page_id) == D:
            return 1, page.first_turn
        latest = self._latest_change(page_id, shown, {p: n for n, p in enumerate(self.wanted)})
        if latest >= 0:
            return 2, latest
        if page_id in self.request.indexed and page_id not in self.index.roots:
            return 4, list(self.request.indexed).index(page_id)
        return 3, page.first_turn

    def _latest_change(self, page_id: str, shown: dict[str, View], changed: dict[str, int]) -> int:
        latest = changed.get(page_id, -1)
        if shown.get(page_id) == U:
            for child in self.index.children(page_id):
                latest = max(latest, self._latest_change(child.id, shown, changed))
        return latest

    def _subtree(self, page_id: str, shown: dict[str, View], nested: bool) -> etree._Element:
        view = shown.get(page_id, S)
        element = node(self.index.get(page_id), view, nested)
        if view == U:
            for child in self.index.children(page_id):
                element.append(self._subtree(child.id, shown, nested=True))
        return element


_RANK = {S: 0, D: 1, U: 2}
