"""The Linear_Flow (§IX): which top-level nodes a synthesis shows, in the order that changes least, and the text they make.

``synthesis`` decides what is admitted under the budget; this lays out what
was admitted as the document and the messages the worker reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lxml import etree

from ..conversation import attached
from ..pages.index import PageIndex
from ..pages.logical import Origin, View
from ..text.tokens import CountText, clip_tokens
from . import document
from .document import FINAL_ROUND_INSTRUCTION, USER_LINE
from .markup import node
from .synthesis_types import SynthesisRequest

__all__ = ["Flow"]

S, D, U = View.SUMMARY, View.DETAIL, View.UNPACKED


class Flow:
    """The document a synthesis lays out: its nodes' places, and its text, for the views admitted so far."""

    def __init__(self, index: PageIndex, wanted: dict[str, View], request: SynthesisRequest, count: CountText, overview: set[str]):
        # ``overview`` is the synthesis's own set: the roots it shows for the overview, as it admits them.
        self.index, self.wanted, self.request, self.count, self.overview = index, wanted, request, count, overview
        self.laid = {page_id: n for n, page_id in enumerate(request.laid)}  # the round before's places

    def detached(self, page_id: str, shown: dict[str, View]) -> bool:
        """Whether ``page_id`` stands alone in the flow: its container is not shown Unpacked."""
        parent = self.index.parent(page_id)
        return parent is not None and shown.get(parent) != U

    def listed(self) -> list[str]:
        """The roots Background_Context lists when they are folded: the conversation's.

        Memory's pages are a few of a store's many; those not shown are not
        part of what the worker can see, and cost it nothing.
        """
        return [root for root in self.index.roots if self.index.get(root).origin == Origin.HISTORY]

    def messages(self, text: str, head: str, parts: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """``head`` as the system message, as the client sent it (with ``context_role`` "user", ``text`` leads with it); the user message: ``text`` (the opening and the
        document), the host's appendix, the user line. A provider's cache finds the prefix the client's own
        requests made (the head, the first message) and, after it, what the previous call's document shares."""
        line = f"{USER_LINE} {FINAL_ROUND_INSTRUCTION}" if self.request.final else USER_LINE
        if self.request.ask_last:  # at most an eighth of the budget: the query shows whole in the document
            line = clip_tokens(self.request.query, self.request.budget // 8, self.count)
        content = f"{text}\n\n{self.request.appendix}\n\n{line}" if self.request.appendix else f"{text}\n\n{line}"
        user = {"role": "user", "content": attached(content, parts)}
        return [{"role": "system", "content": head}, user] if head and self.request.context_role == "system" else [user]

    def document(self, head: str, opening: str, query: str, shown: dict[str, View], unfolded: set[str]) -> str:
        """The user message's text up to its appendix: what leads it (the head, for an upstream that ignores system
        messages; the opening), then the document (``pcp_core.prompt.document``): the registry; the frame replayed, or the
        roots folded into Background_Context and the flow's head; the flow's other nodes (``_layout``); what is new
        with the call. Offsets in a synthesis are in this text."""
        request, frame = self.request, self.request.frame
        nodes = self.nodes(self.layout(shown, unfolded), shown)
        flow = frame.text + nodes if frame is not None else self.background(unfolded) + document.FLOW_OPEN + nodes
        return self.registry(head, opening) + flow + document.FLOW_CLOSE + document.tail(request.trace, query, request.current_time, request.final)

    def registry(self, head: str, opening: str) -> str:
        """The user message's text up to the end of the document's registry: what leads it, then the registry."""
        lead = "".join(f"{text}\n\n" for text in (head if self.request.context_role == "user" else "", opening) if text)
        return lead + document.registry(bool(self.request.parts))

    def background(self, unfolded: set[str]) -> str:
        """The Background_Context: a line for each listed root that is not unfolded."""
        return document.background([self.index.get(r) for r in self.listed() if r not in unfolded])

    def nodes(self, layout: Sequence[str], shown: dict[str, View]) -> str:
        """The text of the top-level nodes of ``layout``."""
        return "".join(document.element_text(self.subtree(page_id, shown, nested=False)) for page_id in layout)

    def layout(self, shown: dict[str, View], unfolded: set[str]) -> list[str]:
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
        tops = [p for p in self.index.roots if p in unfolded] + [p for p in shown if self.detached(p, shown)]
        return sorted(tops, key=lambda page_id: self.place(page_id, shown, unfolded))

    def place(self, page_id: str, shown: dict[str, View], unfolded: set[str]) -> tuple[int, int]:
        """Where a top-level node goes: (its part of the flow, its order in it); parts 0 and 1 make the next frame."""
        page = self.index.get(page_id)
        if page_id == self.request.last:
            return 5, 0
        if self.request.frame is None and page_id in self.overview and page_id not in shown:
            return 0, page.first_turn
        if self.request.frame is None and page_id in self.request.frame_pages and shown.get(page_id) == D:
            return 1, page.first_turn
        if page_id in self.laid:
            return 2, self.laid[page_id]
        latest = self.latest_change(page_id, shown, {p: n for n, p in enumerate(self.wanted)})
        if latest >= 0:
            return 2, len(self.laid) + latest
        if page_id in self.request.indexed and page_id not in self.index.roots:
            return 4, list(self.request.indexed).index(page_id)
        return 3, page.first_turn

    def latest_change(self, page_id: str, shown: dict[str, View], changed: dict[str, int]) -> int:
        """The latest change among ``page_id`` and what is shown under it (-1: none)."""
        latest = changed.get(page_id, -1)
        if shown.get(page_id) == U:
            for child in self.index.children(page_id):
                latest = max(latest, self.latest_change(child.id, shown, changed))
        return latest

    def subtree(self, page_id: str, shown: dict[str, View], nested: bool) -> etree._Element:
        """The element of ``page_id`` at its view, with its children when it is Unpacked."""
        view = shown.get(page_id, S)
        element = node(self.index.get(page_id), view, nested)
        if view == U:
            for child in self.index.children(page_id):
                element.append(self.subtree(child.id, shown, nested=True))
        return element
