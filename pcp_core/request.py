"""One request, by the protocol's rules: when it is paged, what it pages, how its rounds run, what it leaves.

The host reads the request, looks its session up and fulfils the effects;
every decision is made here::

    conversation = Conversation.of(messages, policy.paging.blocks, count)
    if engaged(prompt_tokens(messages, count), policy):
        resolution = ...  # the host's store: the session the chained messages continue
        prepared = prepare(conversation, resolution, policy, facts, count)
        outcome = ...     # the host drives rounds(prepared, count, cache), fulfilling its effects
        session = solidified_session(prepared, outcome)  # what the store keeps

A session with PACT components (``pact``) has them placed after ``prepare``:
``with_components(prepared, conversation, tree)``, the tree as the host's
store keeps it, advanced to this request (``pact.on_request``).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, Sequence
from itertools import chain as chained
from operator import attrgetter
from typing import Any

import msgspec

from .conversation import Conversation, message_text
from .directives.replies import DIRECTIVE_TOOLS
from .effects import CallWorker, Effect, Outcome
from .engine import run_rounds
from .pact.placement import Placement, around, onto_messages, onto_pages, placement
from .pact.tree import Tree
from .pages.blocks import around_handle, block_handle, handle_line, scan
from .pages.logical import Origin, Page, Turn, iso_timestamp
from .paging.history import PagedHistory, PagingPolicy, reopened_from
from .prompt import document
from .prompt.frame import Frame, continues
from .ranking.bm25 import Bm25Cache
from .round_policy import RoundContext, RoundPolicy
from .session import Continuation, Session, branch_id, chain_links, continuation, departs, hold, new_session_id, page_on, resume, solidified
from .text.tokens import Checkpoint, CountText, leading_tokens, part_tokens, prompt_tokens, unchecked

__all__ = [
    "Facts",
    "Paged",
    "Policy",
    "Prepared",
    "Resolution",
    "asked",
    "engaged",
    "head_tokens",
    "pageable",
    "prepare",
    "query_line",
    "question_links",
    "rounds",
    "solidified_session",
    "with_appendix",
    "with_components",
    "with_frame",
    "with_cached_frame",
    "within_conversation",
    "within_window",
]

_ID = attrgetter("id")


class Policy(msgspec.Struct, frozen=True):
    """How requests are served: when protocol mode engages, how histories are paged, how rounds run."""

    threshold: int = 8192  # prompt tokens above which protocol mode engages (the Sentry, §X)
    paging: PagingPolicy = PagingPolicy()
    rounds: RoundPolicy = RoundPolicy()
    window: int = 0  # the model's context window (0: unknown): what fits it may go untouched while that is cheaper

    def with_rounds(self, **changes: Any) -> Policy:
        """This policy with ``changes`` to how its rounds run (``RoundPolicy``'s fields)."""
        return msgspec.structs.replace(self, rounds=msgspec.structs.replace(self.rounds, **changes))


# What a worker call must leave beyond what it carries whatever is paged: the flow's tags, a page's line.
LEAST_ROOM = 64


def pageable(conversation: Conversation, policy: Policy, count: CountText) -> bool:
    """Whether the request can be paged at all: what every worker call carries within the budget whatever is
    paged (the instructions, the query with its attachments, the directives' tools) leaves room in it. The head
    (the client's system prompt and tools) goes whole on top of the budget and does not count. A request that
    cannot is never answered blind: it goes untouched where the model's window may hold it, else it is refused."""
    query = query_line(conversation, policy.paging, count)
    frame = prompt_tokens([{"role": "system", "content": document.registry(False) + document.tail((), query, "2026-01-01T00:00", True)}], count)
    parts = sum(part_tokens(part) for part in conversation.query_parts)
    tools = DIRECTIVE_TOOLS if policy.rounds.channel == "tools" else []
    return frame + parts + (count(json.dumps(tools)) if tools else 0) + LEAST_ROOM <= policy.rounds.budget


# Of a known window, the share a call leaves free: for the answer, and for an upstream that counts tokens otherwise.
WINDOW_SPARE = 8  # an eighth


def within_window(policy: Policy, carried: int) -> Policy:
    """``policy`` fitted to the model's window where one is known: paging engages before a prompt outgrows
    what the window holds, a worker call's pages take no more than the window leaves beside the
    ``carried`` head, and a follow-up's frame no more than leaves room for them. A request that leaves no
    room is then not ``pageable``."""
    if not policy.window:
        return policy
    holds = policy.window - policy.window // WINDOW_SPARE
    threshold, budget = min(policy.threshold, holds), min(policy.rounds.budget, max(holds - carried, 0))
    # A follow-up's frame on top of the budget, leaving a budget more for what its later rounds add.
    cached = min(policy.rounds.cached_budget, max(holds - carried - 2 * budget, 0))
    if (threshold, budget, cached) == (policy.threshold, policy.rounds.budget, policy.rounds.cached_budget):
        return policy
    return msgspec.structs.replace(policy.with_rounds(budget=budget, cached_budget=cached), threshold=threshold)


# The most budgets of cached tokens a follow-up's frame carries on top of its budget, where they cost nothing
# (a local server's slot keeps the prefix): the model's window and the conversation's size bound it too.
FRAME_BUDGETS = 4


def with_cached_frame(policy: Policy) -> Policy:
    """``policy`` with a follow-up's frame carried on top of the budget (``RoundPolicy.cached_budget``): as many
    cached tokens as cost what the follow-up's share of uncached ones does (``followup_share`` of the budget
    over ``cached_input_price``: at a tenth, 1.5 budgets). Read from a provider's cache at that price, they show
    the model more of the conversation for the same bill. None where nothing is cached."""
    rounds = policy.rounds
    price, most = rounds.cached_input_price, FRAME_BUDGETS * rounds.budget
    cached = 0 if price >= 1 else most if price <= 0 else min(int(rounds.followup_share * rounds.budget / price), most)
    return policy.with_rounds(cached_budget=cached)


def within_conversation(policy: Policy, tokens: int) -> Policy:
    """``policy`` with a follow-up's frame on top of the budget (``cached_budget``) no larger than a third of the
    conversation's ``tokens`` beside the head: sent untouched, a provider's cache reads all of it at the same
    price, and a frame that read more would leave little of the saving for what the follow-up adds (a half
    against a third: bench/results-2026-12-02.md)."""
    most = max(tokens // 3, 0)
    if policy.rounds.cached_budget <= most:
        return policy
    return policy.with_rounds(cached_budget=most)


def engaged(prompt_tokens: int, policy: Policy, carried: int = 0) -> bool:
    """The Sentry (§X): token pressure switches chat mode to protocol mode, where paging pays.

    Above the threshold a conversation is paged, unless it still fits the
    model's window and paging it would cost more than sending it as it is
    (``paging_pays``): then it goes untouched, and the provider's cache keeps
    serving what it sent before. ``carried``: of ``prompt_tokens``, the head's
    (``head_tokens``), which both ways send whole.
    """
    if prompt_tokens <= policy.threshold:
        return False
    return not policy.window or prompt_tokens > policy.window or paging_pays(prompt_tokens - carried, policy.rounds)


def paging_pays(prompt_tokens: int, rounds: RoundPolicy) -> bool:
    """Whether a paged follow-up costs less than the same request sent untouched, as providers bill input.

    Untouched, a follow-up's prompt is the one before it and a new turn: the
    cache serves nearly all of it (``prompt_tokens`` at ``cached_input_price``).
    Paged, its frame is served from the cache and what it adds after it (a
    ``followup_share`` of the budget) is billed in full. The new turn is billed
    both ways, and so is a head both carry whole (not in ``prompt_tokens``).
    A frame carried on top of the budget (``cached_budget``) is left out: it
    starts small and grows to it, and the replays measure paging as paying
    from the threshold with it (bench/results-2026-12-02.md).
    Where nothing is cached (``cached_input_price`` 1), paging pays as
    soon as the budget is smaller than the conversation; where a local
    server's slot keeps the prefix (0), it never pays while the conversation fits.
    """
    price, fresh = rounds.cached_input_price, rounds.followup_share * rounds.budget
    return price * prompt_tokens > price * (rounds.budget - fresh) + fresh


class Resolution(msgspec.Struct, frozen=True):
    """The session a request continues, as the host's store found it."""

    found: Session | None = None
    reused: int = 0  # how many of the chained messages ``found`` holds
    links: list[str] = []  # the chain of ``Conversation.chained``, one link a message
    pinned: str | None = None  # the session the client named, if it named one
    # The store's version of ``found`` as it was read: saving the session the request leaves is
    # conditional on it (another request may have kept the session since).
    version: str = ""
    asked: list[str] = []  # the links of the request's question after its chain (``question_links``)

    @property
    def request_links(self) -> list[str]:
        """The request's links: its chain's, then its question's."""
        return [*self.links, *self.asked] if self.asked else self.links


def question_links(conversation: Conversation, links: Sequence[str]) -> list[str]:
    """The links of the request's last message after its chain (``links``), as the client sent it (a turn of
    calls and their results: its messages): the question its session answers (``Session.asked``); none when
    there is none or the chain holds it (a File block)."""
    if conversation.query is None or conversation.query_is_block:
        return []
    return chain_links(conversation.query_sent or [conversation.query], after=links[-1] if links else "")


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    """What the host knows of a request that the rules read."""

    namespace: str  # the caller's: sessions of one never meet another's
    now_ns: int
    client_tools: list[dict[str, Any]] = []
    dense: bool = False  # the host embeds: dense recall joins BM25
    # Summaries the host has for pages, by id (a model's, written in the background).
    summaries: Mapping[str, str] = {}
    # Pages the host's memory recalled for the request (``pcp_core.memory``, origin Storage),
    # the Originals first: they join its pages and share its budget.
    memory: list[Page] = []


class Paged(msgspec.Struct, frozen=True):
    """What paging did for a request: how it found its session, and what it built."""

    how: Continuation
    turns: int  # turns paged now; those the session held are not paged again
    originals: int  # pages built now
    consolidated: int


class Prepared(msgspec.Struct, frozen=True):
    session: Session  # the session as this request leaves it, before its rounds
    new_links: int  # the last ``new_links`` links of its chain are new: what saving it writes
    paged: Paged
    context: RoundContext
    # The pages the rounds read, when PACT components ride on some (``with_components``); else the session's.
    pages: PagedHistory | None = None
    components: int | None = None  # live components rendered; None: the session has none
    recalled: list[Page] = []  # the pages memory recalled for the request (``Facts.memory``)


def query_line(conversation: Conversation, policy: PagingPolicy, count: CountText) -> str:
    """The Query as the worker reads it: a File-block query by its start, its end and its handle."""
    text = conversation.query_text
    if not conversation.query_is_block:
        return text
    turn = _query_turn(conversation, "")
    return handle_line(block_handle(turn), count(text), text, policy.blocks)


def asked(conversation: Conversation, policy: PagingPolicy, count: CountText) -> str:
    """What the query asks, without a file it carries: the text the Router's intent reads (worth encoding early)."""
    return around_handle(query_line(conversation, policy, count))[1]


def prepare(conversation: Conversation, resolution: Resolution, policy: Policy, facts: Facts, count: CountText, checkpoint: Checkpoint = unchecked) -> Prepared:
    """The request's session, paged on from what its store held, and its rounds' context.

    ``checkpoint`` is called between the steps of paging: the host's may raise to stop it.
    """
    history, pinned = conversation.history, resolution.pinned
    now = iso_timestamp(facts.now_ns / 1e9)
    chain = resolution.links[: len(history)]
    links = resolution.request_links
    at = len(links) if resolution.found is None else departs(resolution.found, links)
    # A session it starts is named by where it leaves the one it found (``branch_id``): the same branch, the same id.
    parent = resolution.found.id if resolution.found is not None else None
    fresh = branch_id(facts.namespace, parent, links, at) if links and at is not None else new_session_id(facts.namespace, chain, facts.now_ns)
    found = resume(resolution.found, resolution.reused, chain, now, pinned or fresh, pinned=pinned is not None, request_links=links)
    how = continuation(resolution.found, resolution.reused, pinned=pinned is not None, request_links=links)
    found = msgspec.structs.replace(found, asked=resolution.asked)
    session = page_on(found, history, resolution.reused, count, policy.paging, checkpoint)
    paged = _paged(how, found.pages, session.pages, resolution.reused)
    session = msgspec.structs.replace(session, pages=session.pages.with_summaries(facts.summaries))
    if conversation.query_is_block:
        turn = _query_turn(conversation, now)
        session = hold(session, resolution.links[-1], turn, scan(turn, count, policy.paging.blocks, checkpoint))
    new_links = len(session.chain) - (resolution.reused if how in ("resumed", "pinned") else 0)
    going_on = _goes_on(found.frame, conversation, resolution, policy)
    context = msgspec.structs.replace(
        _context(conversation, policy, facts, now, count), **going_on, last_page_open=_last_page_open(session.pages, policy.paging, count)
    )
    return Prepared(session=session, new_links=new_links, paged=paged, context=context, recalled=facts.memory)


def rounds(prepared: Prepared, count: CountText, cache: Bm25Cache | None = None) -> Generator[Effect, Any, Outcome]:
    """The request's rounds (``engine.run_rounds``) over its session's pages (with the components they carry),
    and the pages memory recalled for it.

    A recalled page is a page of the request like the history's: ranked with
    them, shown within the one budget (``origin="Storage"``); a container's
    pages are faulted in when the worker opens it (``LoadPages``).
    """
    pages = prepared.pages if prepared.pages is not None else prepared.session.pages
    index = pages.index()
    for page in prepared.recalled:
        if page.id not in index:
            index.register(page)
    return run_rounds(prepared.context, index, count, cache)


def with_frame(prepared: Prepared, call: CallWorker) -> Prepared:
    """``prepared`` with its session keeping the frame round 0 made or replayed (``call``): the next
    request that goes on from this one replays it, a prefix a provider's cache reuses."""
    if call.frame is None and prepared.session.frame is None:
        return prepared
    session = msgspec.structs.replace(prepared.session, frame=call.frame)
    return msgspec.structs.replace(prepared, session=session)


def solidified_session(prepared: Prepared, outcome: Outcome) -> Session:
    """The session as the request leaves it: keeping the pages its drafts were solidified into (§VI.5)."""
    return solidified(prepared.session, outcome.solidified)


def with_components(prepared: Prepared, conversation: Conversation, tree: Tree) -> Prepared:
    """``prepared`` with the live components of ``tree`` where they render (``pcp_core.pact.placement``).

    A history message's components ride in its page (the pages the rounds
    read; the session keeps its own, unchanged), the current message's join
    the Query, system-level ones the head.
    """
    placed = placement(tree)
    history = len(conversation.history)
    pages, on_pages = onto_pages(prepared.session.pages, placed, history)
    current = placed.messages.get(history, []) if conversation.query is not None else []
    head = "\n\n".join(message_text(m) for m in onto_messages(conversation.head, Placement(system=placed.system))) if placed.system else prepared.context.head
    # Components change how pages render: no frame is replayed while a session has them.
    context = msgspec.structs.replace(prepared.context, head=head, query=around(prepared.context.query, current), frame=None)
    return msgspec.structs.replace(prepared, pages=pages, context=context, components=len(placed.system) + on_pages + len(current))


def with_appendix(prepared: Prepared, text: str) -> Prepared:
    """``prepared`` with ``text`` after the PagedContext in every worker call's system message (Hybrid
    mode's rules and snapshot), counted in the budget: the pages get what it leaves."""
    return msgspec.structs.replace(prepared, context=msgspec.structs.replace(prepared.context, appendix=text))


def _query_turn(conversation: Conversation, now: str) -> Turn:
    """The query as a turn at the end of the history (a File-block query is paged as one)."""
    query = conversation.query or {}
    return Turn(index=len(conversation.history), role=str(query.get("role", "user")), text=conversation.query_text, timestamp=now)


def _context(conversation: Conversation, policy: Policy, facts: Facts, now: str, count: CountText) -> RoundContext:
    """The rounds' context of the request: its query, its head, its policy, its tools and parts, and the head's tokens."""
    context = RoundContext(
        query=query_line(conversation, policy.paging, count), head=conversation.head_text, current_time=now,
        policy=policy.rounds, opening=leading_tokens(conversation.opening_text, policy.rounds.budget // 4, count),  # cut once; each call fits it to the head
        client_tools=facts.client_tools, dense=facts.dense, query_parts=conversation.query_parts, parts=conversation.history_parts(),
    )  # fmt: skip
    tools, client_tools = context.tools, facts.client_tools
    carried = head_tokens(conversation.head_text, client_tools, count)
    return msgspec.structs.replace(context, reserved_tokens=count(json.dumps(tools)) if tools else 0, carried=carried)


def head_tokens(head: str, client_tools: list[dict[str, Any]], count: CountText) -> int:
    """The tokens of the head every call repeats, the client's system prompt and tool definitions: what a worker
    call carries whole on top of the budget (a provider's cache serves it)."""
    return (count(head) + 4 if head else 0) + (count(json.dumps(client_tools)) if client_tools else 0)


def _goes_on(frame: Frame | None, conversation: Conversation, resolution: Resolution, policy: Policy) -> dict[str, Any]:
    """The context's frame (its session's, when the request goes on from the query it was made for and a
    cache is priced), and where the request's own query is: the frame its rounds leave is for it."""
    history = len(conversation.history)
    chain = resolution.links[:history]
    line = chain_links([conversation.query], after=chain[-1] if chain else "")[0] if conversation.query is not None else ""
    kept = frame is not None and policy.rounds.cached_input_price < 1 and continues(frame, resolution.links[:history])
    return {"frame": frame if kept else None, "query_link": line, "query_at": history}


def _last_page_open(pages: PagedHistory, policy: PagingPolicy, count: CountText) -> bool:
    """Whether the history's last page may still take the next turns: it holds fewer than a page's turns and tokens."""
    history = [page for page in pages.leaves if page.origin == Origin.HISTORY]
    if not history:
        return False
    last = history[-1]
    return last.last_turn - last.first_turn + 1 < policy.page_turns and count(last.content) < policy.page_tokens


def _paged(how: Continuation, known: PagedHistory, paged: PagedHistory, reused: int) -> Paged:
    """What paging did: how the session was found, the turns paged now, the pages built now."""
    before = set(map(_ID, chained(known.leaves, known.containers)))
    return Paged(
        how=how,
        turns=paged.turns - reopened_from(known, reused),
        originals=len(set(map(_ID, paged.leaves)) - before),
        consolidated=len(set(map(_ID, paged.containers)) - before),
    )
