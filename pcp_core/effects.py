"""What the round loop asks of its host, and what it ends in.

``run_rounds`` (``pcp_core.engine``) yields an ``Effect`` where it needs the
world — a model's reply, embeddings, pages from memory — and the host sends
back the answer; the loop's return value is an ``Outcome``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .pages.index import PageState
from .pages.logical import Page
from .prompt.frame import Frame
from .prompt.synthesis_types import Step, Synthesis
from .ranking.router import Intent

__all__ = ["CallRouter", "CallWorker", "Effect", "LoadPages", "Outcome", "Similarity"]


class Similarity(msgspec.Struct, frozen=True):
    """Ask the host how close in meaning each of ``texts`` is to ``query``.

    The reply: the cosine of their embeddings, one per text in order (NaN for
    a text the host has not embedded yet), or None if it has none to offer.
    """

    query: str
    texts: list[str]


class CallRouter(msgspec.Struct, frozen=True):
    """Ask the host's router model; the host sends back its reply text, or None if the call failed."""

    messages: list[dict[str, Any]]


class LoadPages(msgspec.Struct, frozen=True):
    """A page fault: the worker opens a memory container whose pages the request does not hold yet.

    The host sends back the pages of ``ids`` it has (a list; None or fewer
    if some are gone), which join the request's pages.
    """

    ids: list[str]


class CallWorker(msgspec.Struct, frozen=True):
    messages: list[dict[str, Any]]
    round: int
    final: bool
    tools: list[dict[str, Any]]
    synthesis: Synthesis
    # The directives carried out before this call, in order (what its Reasoning_Trace shows).
    trace: list[Step] = []
    # Where its system text divides for a provider whose prompt cache needs marks (Anthropic's): where
    # the frame the request went on from ends (the previous request's entry), where its frame ends (the
    # next one's), where the prefix the call before it kept ends, where the one it keeps ends.
    cuts: list[int] = []
    # Of ``cuts``, those worth a mark (a cache entry), the most valuable first.
    marks: list[int] = []
    # The frame this request made or replayed (``pcp_core.prompt.frame``): what its session keeps for the next request.
    frame: Frame | None = None
    # Tokens of its prompt's opening it shares with the call before it (the previous round's, or the
    # previous request's frame): what a provider's cache may serve, as the host can tell.
    shared: int = 0


class Outcome(msgspec.Struct, frozen=True):
    kind: Literal["answer", "client_tool_calls"]
    text: str
    rounds: int
    trace: list[Step]
    intent: Intent
    # The formal pages Draft pages were solidified into at the ends of the rounds (§VI.5).
    solidified: list[Page] = []
    # The pages the request touched, by id: Hot or Shelved, their heat and staleness (§5.3).
    pages: dict[str, PageState] = {}


Effect = Similarity | CallRouter | LoadPages | CallWorker
