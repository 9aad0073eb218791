"""What a synthesis is asked for, and what it gives: the ``<PagedContext>`` laid out under a budget, and a trace's steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from ..pages.logical import View
from .frame import Frame, Shown

__all__ = ["Step", "Synthesis", "SynthesisRequest"]


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
    # (``consulted``) shows their placeholders in Detail. Each counts ``pcp_core.text.tokens.part_tokens``.
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
    # The previous round's top-level nodes, in order: those shown again keep their places, and what is new comes
    # after them, so a later round's prompt opens with the one before it (a provider's cache serves it).
    laid: Sequence[str] = ()


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
