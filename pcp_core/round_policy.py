"""What a request's rounds run under: the policy (the settings', once) and the request as the rounds see it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from .directives.replies import DIRECTIVE_TOOLS
from .prompt.frame import Frame

__all__ = ["MIN_BUDGET", "RoundContext", "RoundPolicy"]

# The smallest budget a worker call's paged context may have: below it the frame alone may not fit.
MIN_BUDGET = 512


class RoundPolicy(msgspec.Struct, frozen=True):
    """How a request's rounds run (§VI); built once from the settings."""

    # Most prompt tokens of one worker call's paged context, on top of the head it carries whole (``RoundContext.carried``).
    budget: int = 4096
    max_rounds: int = 4
    # A follow-up whose frame is carried on top of the budget (``cached_budget``) calls the worker at most this many
    # times: each of its Consults reads the frame again, and past the first they found little (bench/results-2026-12-02.md).
    followup_rounds: int = 2
    channel: Literal["text", "tools"] = "text"  # how the worker's directives come: in its text, or as tool calls
    router: bool = False  # the host's router model picks among the best-ranked pages (§VI.2)
    hot_pages: int = 40  # pages the Router may make Hot; the budget decides how many show
    # The Router's best pages, which go before the roots' overview in round 0 and stay in
    # every round after: the worker answers from one prompt, whichever round it is.
    focus: int = 4
    # Of the budget, for roots shown by their Summary; the rest fold into Background_Context.
    # Evidence first: on LoCoMo a smaller overview leaves more room for pages, and recalled more (bench/rounds.py).
    overview_share: float = 0.10
    indexed_pages: int = 6  # the next-ranked pages, shown by summary as Consult targets
    recent_pages: int = 2  # the latest Original pages, kept verbatim while they fit
    explore_hits: int = 3
    diffusion_pages: int = 3  # Original pages a Consult on a container brings in beside it
    # Where the client's head goes: the system message, or the user message's opening, for upstreams that ignore system messages.
    context_role: Literal["system", "user"] = "system"
    # The user message ends with the query itself, not the line that points to it in the document: a model too
    # small to find the Query there (the embedded 135M one) answers the last thing it reads.
    ask_last: bool = False
    # For providers' prompt caches: a later round keeps in their place the nodes of the round
    # before that start within this share of the budget (after what the round brought in).
    keep_share: float = 0.7
    fresh_room: int = 1200  # but a later round keeps this many tokens for what it brings in
    # What a cached input token costs against one that is not (OpenAI's and Anthropic's cache reads:
    # a tenth). Below 1, a conversation keeps a frame (``pcp_core.prompt.frame``) its follow-ups replay.
    cached_input_price: float = 0.1
    # With a frame: the most of the budget a follow-up adds that a provider's cache has not seen, billed
    # in full: the pages of the turns since, the query, the pages ranked for it. The frame is made
    # again when it leaves less room. What a follow-up is billed grows with it, on any conversation; round 0
    # shows fewer pages ranked for a new question, and the Consults make most of that up (bench/prefix_cache.py).
    followup_share: float = 0.15
    # The most of the budget a frame takes when it is made: it grows by the turns since.
    frame_share: float = 0.25
    # The most tokens of a replayed frame a follow-up's calls carry on top of the budget: the cheap tokens, read
    # from a provider's cache at ``cached_input_price``. The frame then keeps all a request showed after it,
    # so what the conversation's questions asked for stays in view, and is made again once it outgrows this.
    # 0: the budget holds the frame too (where a user sets the budget, it stays the cap).
    cached_budget: int = 0


class RoundContext(msgspec.Struct, frozen=True, kw_only=True):
    """One request as the rounds see it."""

    query: str
    head: str = ""
    opening: str = ""  # the client's first message (``Conversation.opening_text``)
    current_time: str
    policy: RoundPolicy = RoundPolicy()
    client_tools: list[dict[str, Any]] = []
    # Tokens of tool definitions sent with each worker call.
    reserved_tokens: int = 0
    # Tokens of the head every call repeats, the client's system prompt and tool definitions: they go whole, cached
    # by the provider, on top of the budget (the paged context gets all of it).
    carried: int = 0
    # Ask the host for embeddings and fuse dense recall with BM25.
    dense: bool = False
    # Parts that are not text (images, audio, files): the query's, sent with every worker call;
    # the history's by handle, sent again with the pages the worker asks for.
    query_parts: list[Any] = []
    parts: Mapping[str, Any] = {}
    # Text the host adds to the system message after the PagedContext (Hybrid mode's rules and
    # snapshot), within the budget: after the document, so the document's prefix stays cacheable.
    appendix: str = ""
    # The frame the request goes on from (``pcp_core.prompt.frame``); None: it makes one.
    frame: Frame | None = None
    # The query's chain link and place in the conversation: the next request goes on from here.
    query_link: str = ""
    query_at: int = 0
    # Whether the history's last page may still take the next turns (it is not full): then it stays out
    # of the frame, which would show it as it no longer is.
    last_page_open: bool = True

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools every worker call carries: the client's, and the directives' in the tools channel."""
        return [*self.client_tools, *(DIRECTIVE_TOOLS if self.policy.channel == "tools" else [])]
