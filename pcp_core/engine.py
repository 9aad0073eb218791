"""The intent-driven round loop (§VI) as a generator of effects.

The engine does no I/O. It yields effects — ``Similarity`` (the host sends
back cosines, or None), ``CallRouter`` (the router model's reply) and
``CallWorker`` (the host sends back a ``WorkerReply``) — and when the loop ends, returns an ``Outcome``::

    loop = run_rounds(context, index, count)
    effect = next(loop)
    while True:
        try:
            effect = loop.send(fulfil(effect))
        except StopIteration as done:
            outcome = done.value
            break

One request: anchor the intent (head + tail), address pages (scored by BM25,
plus dense recall when the host embeds; a router model, when the host has one, picks
among the best; those become Hot, the latest turns stay in Detail), synthesize, call the
worker, parse its directives, apply them to the view state, and loop — at most
``max_rounds`` calls (a follow-up with its frame on top, ``followup_rounds``), the last of which must answer.

The Draft pages of the history's PBlocks (large messages, ``pcp_core.pages.blocks``)
are addressed with the history's pages; the drafts a round shows above Summary
are solidified (§VI.5), and the ``Outcome`` carries them for the host to keep.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Literal

import msgspec

from .addressing import Addressed, address
from .directives.answers import NO_ANSWER
from .directives.replies import WorkerReply, calls_client_tool, read_reply
from .directives.vocabulary import Consult, Directive, Explore
from .directives.zooming import carry_out, diffuse, still_raised
from .effects import CallWorker, Effect, LoadPages, Outcome
from .pages.blocks import solidify
from .pages.index import Activation, PageIndex
from .pages.logical import ConsolidatedPage, Origin, Page, View
from .pages.views import ViewState
from .prompt.frame import Frame, extended, prompt_text, ranked_again, shared_tokens, spans_of, stand_in, stored_end
from .prompt.markup import node_lines
from .prompt.synthesis import synthesize
from .prompt.synthesis_types import Step, Synthesis, SynthesisRequest
from .ranking.bm25 import Bm25Cache
from .ranking.router import anchor_intent, broad_match, lexical_scores
from .round_policy import RoundContext, RoundPolicy
from .text.tokens import CountText

__all__ = ["kept_nodes", "run_rounds"]

_DEFAULT = RoundPolicy()


def run_rounds(context: RoundContext, index: PageIndex, count: CountText, cache: Bm25Cache | None = None) -> Generator[Effect, Any, Outcome]:
    """The request's rounds: addressed, then worker calls until one answers or the rounds run out."""
    addressed = yield from address(context, index, count, cache)
    loop = _Loop(context, index, addressed, count, cache)
    for round_no in range(loop.rounds):
        reply = yield loop.call(round_no)
        faulted = loop.unloaded(reply)
        if faulted:
            loop.load((yield LoadPages(faulted)) or [])
        outcome = loop.outcome(reply, round_no)
        if outcome is not None:
            return outcome
    raise AssertionError("unreachable: the last round always answers")


class _Loop:
    """The rounds' state: the views, what the worker asked for and read, the trace."""

    def __init__(self, context: RoundContext, index: PageIndex, addressed: Addressed, count: CountText, cache: Bm25Cache | None):
        policy = context.policy
        self.context, self.policy, self.index, self.addressed, self.count, self.cache = context, policy, index, addressed, count, cache
        self.views = ViewState(index)
        ranked = addressed.ranked
        self.hot, self.indexed = ranked[: policy.hot_pages], ranked[policy.hot_pages : policy.hot_pages + policy.indexed_pages]
        # The overview (§7.2 Level 1): the conversation's roots, newest first, then the containers memory
        # recalled (a Consult opens one, and brings in the best of its pages the worker has not read).
        history = [root for root in reversed(index.roots) if index.get(root).origin == Origin.HISTORY]
        self.overview = [*history, *(root for root in index.roots if root not in history and isinstance(index.get(root), ConsolidatedPage))]
        history_pages = [page for page in addressed.leaves if page.origin == Origin.HISTORY]
        # The latest closed pages go in the frame the request makes; the last page, which the next
        # request's turns reopen, after it.
        opened = history_pages[-1:] if context.last_page_open else []
        closed = history_pages[: len(history_pages) - len(opened)]
        latest = closed[-policy.recent_pages :] if policy.recent_pages else []
        self.frame_pages = [page.id for page in latest]
        self.recent = [page.id for page in [*latest, *opened]][::-1]
        self.kept: list[str] = []
        self.caching = policy.cached_input_price < 1
        self.capped = self.caching and context.frame is not None  # the request goes on from a frame: its fresh part is bounded
        self.on_top = self.capped and bool(policy.cached_budget)  # and that frame is carried on top of the budget
        self.rounds = min(policy.max_rounds, policy.followup_rounds) if self.on_top else policy.max_rounds
        self.stale_tokens = 0  # of the frame: pages the previous request showed after it, kept beside those ranked again
        self.remade = 0  # of the frame the request made again: as new to a provider's cache as what comes after it
        self.frame = self._extended(context.frame, closed) if self.caching else None
        self.open = opened[0].id if opened else None
        self.covered = closed[-1].last_turn + 1 if closed else 0  # the turns of the closed pages
        for page_id in dict.fromkeys([*self.hot, *self.recent]):
            self.views.raise_to(page_id, View.DETAIL, unfold=False)  # Hot: injected directly
            index.activate(page_id, Activation.HOT)
            index.touch(page_id)
        self.standalone: set[str] = set()  # pages the last synthesis showed outside their container
        self.consulted: list[str] = []  # newest first: the worker's own choices come before the Router's
        self.diffused: list[str] = []  # newest first: what reactive diffusion brought in beside them
        self.read: set[str] = set()  # pages the worker has been shown in Detail
        self.solid: dict[str, Page] = {}  # Draft pages solidified so far, by id
        self.trace: list[Step] = []
        self.faulted = False
        self.previous = ""  # the text of the previous call's prompt
        self.changed: list[str] = []  # what the last round's directives brought in
        self.laid: list[str] = []  # the previous round's top-level nodes, in order

    def _extended(self, frame: Frame | None, closed: Sequence[Page]) -> Frame | None:
        """``frame`` with what the previous request showed after it and the closed pages of the turns since. Where the
        frame may grow past the budget (``cached_budget``), all it showed stays, in its place: what the conversation's
        questions asked for stays in view at the cached price, and a follow-up's share goes to pages not shown yet.
        Else the pages this request ranks again (``ranked_again``)."""
        if frame is None:
            return None
        new = [page for page in closed if page.first_turn >= frame.turns]
        if self.on_top:
            kept, self.stale_tokens = list(frame.after), sum(self.count(shown.text) for shown in frame.after)
        else:
            best = [self.index.get(page_id) for page_id in self.hot]
            kept, self.stale_tokens = ranked_again(frame.after, best, self._share(), self.count)
        return extended(frame, new, self.count, self.context.query_link, self.context.query_at, kept)

    def _made(self, synthesis: Synthesis, said_turns: int) -> Frame:
        """The frame the next request may replay: the head of ``synthesis``'s document (a new frame, or the one it
        replayed), with the turns each page it shows covers (those the tree has replaced keep theirs)."""
        context = self.context
        if self.frame is not None:
            frame = msgspec.structs.replace(self.frame, line=context.query_link, at=context.query_at, after=synthesis.after)
        else:
            tokens = self.count(synthesis.frame_text)
            frame = Frame(text=synthesis.frame_text, shown=synthesis.frame_shown, tokens=tokens, turns=said_turns, line=context.query_link, at=context.query_at)
            frame = msgspec.structs.replace(frame, after=synthesis.after)
        pages = self.index.pages
        added = [pages[page_id] for page_id in frame.shown if page_id not in frame.spans and page_id in pages]  # a page's turns stay its own
        return msgspec.structs.replace(frame, spans={**frame.spans, **spans_of(added)}) if added else frame

    def call(self, round_no: int) -> CallWorker:
        """The worker call of round ``round_no``: the PagedContext of what is raised, within the budget."""
        synthesis = self._synthesize(round_no)
        if synthesis.overflow:  # the frame leaves less than a follow-up's room: it is made again
            synthesis = self._remade(round_no)
        if self.caching:
            self.frame = self._made(synthesis, self.covered)
        call = self._called(synthesis, round_no)
        if self.on_top and self.frame is not None:
            # The next round replays this one as it is and adds after it: a page shown again higher comes after.
            self.frame = extended(self.frame, [], self.count, self.frame.line, self.frame.at, self.frame.after)
        return call

    def _remade(self, round_no: int) -> Synthesis:
        """The call's synthesis with the frame made again. The new frame is as new to a provider's cache as the
        pages after it: a follow-up's share holds them both, so a request that makes its frame again costs what
        any follow-up does, not a frame more."""
        self.frame = None
        synthesis = self._synthesize(round_no)
        if not self.capped or round_no:
            return synthesis
        self.remade = self.count(synthesis.frame_text)
        return self._synthesize(round_no)

    def _budget(self, round_no: int) -> int:
        """A call's budget: the policy's on top of the carried head, and, in a follow-up that replays a frame, the
        frame's tokens up to ``cached_budget`` (and what the rounds before added to it): a provider's cache serves
        them at a fraction of the price."""
        frame = self.frame if self.on_top else None
        cached = min(frame.tokens, self.policy.cached_budget + round_no * self._share()) if frame is not None else 0
        return self.policy.budget + self.context.carried + cached

    def _unchanged_laid(self) -> list[str]:
        """The previous round's top-level nodes that the directives since left as they were (a node that shows a
        page they raised reads otherwise now, and goes after them with the rest of what is new)."""
        touched = {page for changed in self.changed for page in (changed, *self.index.ancestors(changed)) if page in self.index}
        return [page for page in self.laid if page not in touched]

    def _fresh_tokens(self, round_no: int) -> int | None:
        """Most tokens a call of a follow-up shows after its frame: round 0 its ``_fresh`` part; a later round, where a
        frame carried on top of the budget replays the rounds before, a share more. None: the budget's (a later
        round where the budget holds the frame too fills it, as the first request's do)."""
        if not self.capped or (round_no and not self.on_top):
            return None
        return self._share() if round_no else self._fresh()

    def _share(self) -> int:
        """What one call of a follow-up may add that a provider's cache has not seen: its share of the budget."""
        return int(self.policy.followup_share * self.policy.budget)

    def _fresh(self) -> int:
        """What a follow-up may add after its frame: its share of the budget less what is new in any case (the
        pages of the turns since the frame was stored, the pages ranked for it that kept their place, the
        query, a frame made again; not the pages kept beside those, which the cache serves), and never less than
        the last page."""
        stored, frame = self.context.frame, self.frame
        grown = frame.tokens - stored.tokens - self.stale_tokens if frame is not None and stored is not None else 0
        new = grown + self.count(self.context.query) + self.remade
        last = self.count(node_lines(self.index.get(self.open), View.DETAIL)) if self.open is not None else 0
        return max(self._share() - new, last)

    def _synthesize(self, round_no: int) -> Synthesis:
        """This round's prompt, within the budget: what it keeps of the round before, what it brings in."""
        context, policy = self.context, self.policy
        final, fresh = self._final(round_no), self._fresh_tokens(round_no)
        request = SynthesisRequest(
            current_time=context.current_time,
            query=context.query,
            head=context.head,
            opening=context.opening,
            trace=list(self.trace),
            final=final,
            budget=self._budget(round_no),
            carried=context.carried,
            # Round 0: the focus, the overview (§7.2 Level 1), the rest; after a Consult, see _priorities.
            priorities=[
                *([self.open] if self.frame is not None and self.open is not None else []),  # the turns the frame does not hold yet
                # A frame on top of the budget keeps what the cache has first; else what the Consult asked for comes first.
                *([*self.kept, *self.changed] if self.on_top else [*self.changed, *self.kept]),
                *_priorities(self.consulted, self.diffused, self.hot, self.read, self.overview, self.indexed, self.recent, final, policy.focus),
            ],
            indexed=self.indexed,
            reserved_tokens=context.reserved_tokens,
            overview_budget=int(policy.overview_share * policy.budget),
            query_parts=context.query_parts,
            parts=context.parts,
            consulted=self.consulted,
            context_role=policy.context_role,
            ask_last=policy.ask_last,
            appendix=context.appendix,
            frame=self.frame,
            frame_pages=self.frame_pages,
            fresh_tokens=fresh,
            # A call that replays a frame leaves room for what it may add, or the frame is made again.
            frame_room=fresh if fresh is not None else min(policy.fresh_room, policy.budget // 2),
            frame_budget=int(policy.frame_share * policy.budget),
            last=self.open,
            laid=self._unchanged_laid(),
        )
        return synthesize(self.index, self.views.raised(), request, self.count)

    def _called(self, synthesis: Synthesis, round_no: int) -> CallWorker:
        """The worker call of a round's synthesis: the frame it keeps, what it shares with the call before."""
        context, policy = self.context, self.policy
        shown = [p for p in synthesis.layout if p != self.open]  # what the call shows, but the last page
        # What the next round keeps in its place: with a frame on top of the budget, all the cache holds of this one.
        before, self.kept = self.kept, shown if self.on_top else kept_nodes(synthesis, policy)
        frame_end = synthesis.frame_end if self.frame is not None else None
        kept_end = synthesis.end_of(self.kept)
        shown_end = synthesis.end_of(shown) if policy.cached_budget else None  # the next request's frame ends there
        # Where earlier requests' prompts cut the frame (their cache entries end there), then this call's own ends.
        start = synthesis.frame_end - len(synthesis.frame_text)
        replayed = [start + cut for cut in self.frame.cuts] if self.frame is not None else []
        cuts = sorted({cut for cut in (*replayed, self._stored_end(synthesis), frame_end, synthesis.end_of(before), kept_end, shown_end) if cut is not None})
        marks = list(dict.fromkeys(cut for cut in (shown_end, kept_end, frame_end) if cut is not None))
        self.standalone, self.laid = set(synthesis.standalone), synthesis.layout
        self.read.update(p for p, view in synthesis.shown.items() if view == View.DETAIL)
        # What the round shows is what its end finds read: those drafts become formal pages.
        self.solid.update((page.id, page) for page in solidify(synthesis.shown, self.index))
        messages, tools, trace, frame = synthesis.messages, context.tools, list(self.trace), self.frame
        shared, final, self.previous = self._shared(synthesis), self._final(round_no), prompt_text(messages)
        return CallWorker(
            messages=messages, round=round_no, final=final, tools=tools, synthesis=synthesis, trace=trace, cuts=cuts, marks=marks, frame=frame, shared=shared
        )

    def _shared(self, synthesis: Synthesis) -> int:
        """Tokens of the prompt's opening the call before it had too: the previous round's prompt, or the frame replayed."""
        return shared_tokens(self.previous, prompt_text(synthesis.messages), self._stored_end(synthesis), self.count)

    def _stored_end(self, synthesis: Synthesis) -> int | None:
        """Where the stored frame ends in this round's frame text, if it is there whole."""
        return stored_end(self.context.frame, synthesis.frame_text, synthesis.frame_end)

    def unloaded(self, reply: WorkerReply) -> list[str]:
        """The pages a memory container the reply Consults holds that the request has not loaded (a page fault)."""
        _, directives, _ = read_reply(reply)
        wanted: list[str] = []
        for directive in directives:
            page = self.index.pages.get(directive.id) if isinstance(directive, Consult) else None
            if isinstance(page, ConsolidatedPage) and page.origin != Origin.HISTORY:
                wanted += [child for child in page.source_ids if child not in self.index]
        return list(dict.fromkeys(wanted))

    def load(self, pages: Sequence[Page]) -> None:
        """Memory pages the host faulted in: they join the index under their containers."""
        for page in pages:
            if page.id not in self.index and page.origin != Origin.HISTORY:
                self.index.register(page)

    def outcome(self, reply: WorkerReply, round_no: int) -> Outcome | None:
        """How the request ends with ``reply``; None when its directives were carried out and another round follows."""
        done = round_no + 1
        if calls_client_tool(reply.tool_calls, self.context.client_tools):
            return self._ended("client_tool_calls", reply.text, done)
        text, directives, faults = read_reply(reply)
        if reply.delivered or self._final(round_no) or not (directives or faults):
            return self._ended("answer", text.strip() or NO_ANSWER, done)
        self.index.tick()  # the round is over: what the directives touch is touched in the next
        self.trace += [Step("BusFault", fault.raw[:120], fault.reason) for fault in faults]
        self.changed = []
        for directive in directives:
            self._carry_out(directive, round_no)
        # A Bus Fault is explained once, in the trace; the next round must answer (§2.4).
        self.faulted |= bool(faults)
        self.views.settle(round_no)
        return None

    def _final(self, round_no: int) -> bool:
        """Whether round ``round_no`` must answer: the last, or one after a Bus Fault (§2.4)."""
        return self.faulted or round_no == self.rounds - 1

    def _ended(self, kind: Literal["answer", "client_tool_calls"], text: str, rounds: int) -> Outcome:
        """The outcome the rounds end with."""
        return Outcome(kind, text, rounds, self.trace, self.addressed.intent, list(self.solid.values()), self.index.states())

    def _standing_in(self, directive: Directive) -> Directive:
        """``directive`` on the page that now holds the turns of one the frame shows and the tree has replaced."""
        frame = self.context.frame
        page_id = stand_in(frame, self.index.pages, _named_page(directive)) if frame is not None else None
        if page_id is None:
            return directive
        return msgspec.structs.replace(directive, **{"handle" if isinstance(directive, Explore) else "id": page_id})

    def _carry_out(self, directive: Directive, round_no: int) -> None:
        """Carry out one directive of the worker's, and record it in the trace."""
        named, directive = directive, self._standing_in(directive)
        # With the frame on top of the budget, a page it shows is in its place there: a Consult shows it again on its own.
        frame = self.frame if self.on_top else None
        alone = self.standalone | set(frame.shown) if frame is not None else self.standalone
        step, asked = carry_out(directive, self.views, self.index, self._explore, round_no, alone, self.policy.explore_hits)
        if directive is not named:  # the worker reads in the trace where the page it named went
            step = msgspec.structs.replace(step, result=f"{_named_page(named)} now stands as {step.target}; {step.result}")
        self.trace.append(step)
        self.faulted |= step.action == "BusFault"
        views = self.views
        self.consulted = still_raised([*asked, *self.consulted], views)
        diffused = diffuse(directive, self.addressed.ranked, self.index, views, round_no, self.read, self.policy.diffusion_pages)
        self.changed += [*asked, *diffused]
        self.diffused = still_raised([*diffused, *self.diffused], views)

    def _explore(self, keywords: Sequence[str]) -> list[str]:
        """The worker's own search: its keywords (and the times they name) addressed as a query is."""
        addressed = self.addressed
        wanted = anchor_intent("", ", ".join(keywords), now=addressed.now)
        return broad_match(wanted, addressed.leaves, lexical_scores(wanted, addressed.texts, self.cache))


def _named_page(directive: Directive) -> str:
    """The page a directive names (an Explore's handle)."""
    return directive.handle if isinstance(directive, Explore) else directive.id


def kept_nodes(synthesis: Synthesis, policy: RoundPolicy) -> list[str]:
    """The top-level nodes of ``synthesis`` that start within ``keep_share`` of the budget, leaving ``fresh_room``: what the next call keeps in place.

    The more a later round keeps, the more of its prompt a provider's cache serves and the more often the
    answering prompt holds the evidence; but a round that keeps most of its prompt has little room for what a
    Consult brings, and ≤ 3 Consults recalls less. Hence ``fresh_room`` (``bench/rounds.py`` measures the trade).
    """
    limit = min(policy.keep_share * policy.budget, policy.budget - policy.fresh_room)
    return [page_id for page_id, start in zip(synthesis.layout, synthesis.starts) if start < limit]


def _priorities(
    consulted: list[str],
    diffused: list[str],
    hot: list[str],
    read: set[str],
    overview: list[str],
    indexed: list[str],
    recent: list[str],
    final: bool = False,
    focus_pages: int = _DEFAULT.focus,
) -> list[str]:
    """What to show first. Round 0: the intent's focus, the overview (§7.2 Level 1), the rest.

    After a Consult: what the worker asked for and what diffusion found in
    it that it has not read, then the focus (Overflow Governance dehydrates
    the pages outside it, §III.2). Then, while the worker may still ask, the
    pages it has not read come before the overview and the pages it has
    seen; the final round cannot ask, and the rest of the Router's best
    pages follow in its order. The worker answers from one prompt, and one
    that asks for more has not always read all it needs.
    """
    focus, rest = hot[:focus_pages], hot[focus_pages:]
    if not read:
        return [*consulted, *diffused, *focus, *overview, *rest, *indexed, *recent]
    fresh = [p for p in diffused if p not in read]
    stale = [p for p in diffused if p in read]
    if final:
        return [*consulted, *fresh, *focus, *rest, *overview, *stale, *indexed, *recent]
    unread = [p for p in rest if p not in read]
    seen = [*stale, *(p for p in rest if p in read)]
    return [*consulted, *fresh, *focus, *unread, *overview, *seen, *indexed, *recent]
