"""Hybrid v3 mode on requests (docs/hybrid.md): the session's snapshot into every worker call, the model's out of every answer.

The rules are ``pcp_core.hybrid``; this is where a request meets them:

* ``Hybrid.begin`` decides from ``PCP_HYBRID`` and ``x-pcp-context-mode``
  whether a request is in the mode (None: it is not, and nothing changes);
* below the threshold ``ContextTurn.passthrough`` finds the session (named in
  ``x-pcp-session``, else recognised by its conversation's hash chain), and
  puts the rules and the snapshot at the end of the leading system message;
  in protocol mode ``ContextTurn.protocol`` does so after the PagedContext,
  within the budget;
* ``ContextTurn.sections`` cuts each answer at the separator
  (``proxy.hybrid.relay``), and ``finish`` reads what the model wrote, by the
  rules, and keeps it on the session.

The store is ``proxy.hybrid.store``; the API ``proxy.hybrid.api``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from pcp_core import Conversation, Prepared, Resolution, chain_links, conversation_links, message_text, with_appendix
from pcp_core.conversation import conversation_start
from pcp_core.hybrid import (
    Block,
    Cold,
    LimitsPolicy,
    RoundFacts,
    Runtime,
    Snapshot,
    Todo,
    check,
    context_prompt,
    continued_links,
    kept_cold,
    normal_workspace,
    parse_context,
    read_snapshot,
    this_round,
    with_system_text,
)
from pcp_core.session import new_session_id

from .. import headers as pcp
from ..errors import ClientError
from ..settings import CHAT_BUDGET
from .relay import Sections
from .store import HybridState, HybridStore

if TYPE_CHECKING:
    from pcp_core import CountText

    from ..apis.codec import Reading
    from ..metrics import Metrics
    from ..settings import Settings

__all__ = ["ContextTurn", "CoreMemory", "Hybrid"]

log = logging.getLogger("pcp.hybrid")

MODES = ("enabled", "disabled")


class CoreMemory(Protocol):
    """Where ``memory.core`` outlives a session: a memory scope's (``proxy.memory.scope_cores``).

    Blocking (it may read the disk); called where the session's context is
    loaded and kept. ``scope``: the store's key of the request's memory scope.
    """

    def recall(self, scope: str) -> Sequence[Block]:
        """The core blocks the scope keeps."""

    def keep(self, scope: str, blocks: Sequence[Block], seen: Collection[str]) -> None:
        """``blocks`` merged into what the scope keeps; ``seen``: the ids of the scope's blocks the session was shown."""


class Hybrid:
    """Hybrid mode for the app: the switch, the store, and the rules as the settings tune them."""

    def __init__(self, settings: Settings, store: HybridStore, count: CountText, metrics: Metrics, memory: CoreMemory | None = None):
        """Hybrid mode as the settings have it, its state kept in ``store``."""
        self.default = settings.hybrid
        self.store = store
        self.count = count
        self.metrics = metrics
        self.memory = memory
        self.limits = LimitsPolicy(max_decay=settings.hybrid_max_decay, min_confidence=settings.hybrid_min_confidence)
        # The snapshot's room: its share of the budget, less the rules that come with it.
        self.room = max(int((settings.context_budget or CHAT_BUDGET) * settings.hybrid_budget_share) - count(context_prompt(_EMPTY)), 0)

    def in_mode(self, headers: Mapping[str, str]) -> bool:
        """Whether a request with these headers may be in the mode (``begin`` then says whether it is): a cheap look, before its namespace is computed."""
        return self.default != "off" and (self.default == "enabled" or pcp.CONTEXT_MODE in headers)

    def begin(self, headers: Mapping[str, str], namespace: str, scope: str | None = None) -> ContextTurn | None:
        """This request's turn in the mode, or None when it is not in it (then nothing of it changes).

        ``namespace``: the caller's; ``scope``: the store's key of its memory scope, whose core blocks it shares.
        """
        if not self.in_mode(headers):
            return None
        asked = headers.get(pcp.CONTEXT_MODE)
        mode = "enabled" if asked is None else asked.strip().lower()
        if asked is not None and mode not in MODES:  # not asked: enabled
            raise ClientError(f"{pcp.CONTEXT_MODE} must be enabled or disabled, not {asked[:40]!r}", param=pcp.CONTEXT_MODE, code="invalid_context_mode")
        return ContextTurn(self, headers, namespace, enabled=mode == "enabled", scope=scope)

    def close(self) -> None:
        """Close the store."""
        self.store.close()


class ContextTurn:
    """One request in Hybrid mode: its session's snapshot shown, its answer's read and kept.

    A request that sends ``x-pcp-context-mode: disabled`` is told not to write
    a context section (the spec's runtime switch); one it writes anyway is
    taken out of the answer all the same, and not kept.
    """

    def __init__(self, hybrid: Hybrid, headers: Mapping[str, str], namespace: str, enabled: bool, scope: str | None = None):
        """A request's turn in Hybrid mode, ``enabled`` or not, with its headers and the caller's namespace."""
        self.hybrid = hybrid
        self.namespace = namespace
        self.enabled = enabled
        self.headers = headers
        workspace = headers.get(pcp.WORKSPACE)
        self.workspace = normal_workspace(workspace) if workspace is not None else None
        self.scope = scope if hybrid.memory is not None else None
        self.seen: frozenset[str] = frozenset()  # the ids of the scope's core blocks the model is shown
        self.session_id = ""
        self.round = 0
        self.shown: Snapshot | None = None  # the snapshot the model is shown (None: the mode is disabled for this request)
        self.cold = Cold()
        self.startup_at = 0
        self.link = ""  # the conversation's link, when the session is known by it
        self.written: tuple[str | None, int] = (None, 0)  # the latest section the model wrote, and how many separators
        self.tool_calls = False  # the answer calls tools: a step of the client's, not a response that owes a section

    @property
    def prompt(self) -> str:
        """The snapshot to show the model, as the system prompt's section."""
        return context_prompt(self.shown)

    def response_headers(self) -> dict[str, str]:
        """The headers the answer carries: the round, once a snapshot was shown."""
        return {pcp.CONTEXT_ROUND: str(self.round)} if self.shown is not None else {}

    # -- loading the session's snapshot -------------------------------------------------------
    def _load(self, session_id: str | None, parents: Sequence[str], messages: Sequence[Mapping[str, Any]], links: Sequence[str]) -> None:
        """The session (``session_id``, else the one the conversation continues, else a new one) and the snapshot this round shows.

        Blocking: the store may read the disk. A session new to the mode starts
        from the one it continues (``parents``: a fork's parent; or the
        conversation's last round, below the threshold), if there is one.
        """
        store, namespace = self.hybrid.store, self.namespace
        continued = (
            found for link in continued_links(messages, links) if (found := store.session_at(namespace, link)) is not None
        )  # looked up only if need be
        self.session_id = session_id or next(continued, None) or new_session_id(namespace, links, time.time_ns())
        state = store.get(namespace, self.session_id)
        if state is None:
            state = next((s for c in [*parents, *continued] if c != self.session_id and (s := store.get(namespace, c)) is not None), None)
        self._show(state or HybridState(), message_text(messages[-1]) if messages else "")

    def _show(self, state: HybridState, query: str) -> None:
        """The snapshot this round shows, from the session's state and the query."""
        now = datetime.now(UTC)
        self.round = state.round + 1
        self.startup_at = state.startup_at or int(now.timestamp() * 1000)
        workspace = self.workspace if self.workspace is not None else state.snapshot.runtime.workspace if state.snapshot is not None else ""
        facts = RoundFacts(round=self.round, workspace=workspace, now=now, startup_at=self.startup_at, todo=state.todo, query=query)
        hybrid = self.hybrid
        shared = hybrid.memory.recall(self.scope) if hybrid.memory is not None and self.scope else ()
        given = state.given if self.scope else ()
        self.shown, self.cold = this_round(state.snapshot, facts, state.cold, hybrid.room, hybrid.count, limits=hybrid.limits, shared_core=shared, given=given)
        shared_ids = {block.id for block in shared}  # those shown: a block past the tier's room was not
        self.seen = frozenset(block.id for block in self.shown.memory.core if block.id in shared_ids)
        self._count_cold(state.cold)

    def _count_cold(self, before: Cold) -> None:
        """Count the cold payloads sent and the blocks rehydrated this round."""
        assert self.shown is not None
        metrics, stamp = self.hybrid.metrics, self.shown.runtime.datetime
        metrics.inc("pcp_context_cold_total", len(self.cold.payloads.keys() - before.payloads.keys()), event="sent")
        metrics.inc("pcp_context_cold_total", sum(block.rehydrated_at == stamp for _, block in self.shown.memory.blocks()), event="rehydrated")

    # -- below the threshold -----------------------------------------------------------------
    async def passthrough(self, request: Reading, body: bytes, pcp_headers: dict[str, str]) -> bytes:
        """The body to forward: the rules and the session's snapshot at the end of the leading system message."""
        if self.enabled:
            pinned = pcp.pinned_session(self.headers)
            messages = request.messages[conversation_start(request.messages) :]
            links = chain_links(messages) if pinned is None else []  # a named session needs no recognising
            self.link = links[-1] if links else ""
            if pinned is not None and self.hybrid.store.in_memory(self.namespace, pinned):
                self._load(pinned, (), messages, links)
            else:
                await asyncio.to_thread(self._load, pinned, (), messages, links)
            pcp_headers.update(self.response_headers())
            if pinned is None:
                pcp_headers[pcp.SESSION] = self.session_id  # how the client finds its context (GET …/context)
        fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])  # the fields the proxy does not read stay as they came
        messages = msgspec.json.decode(fields["messages"])  # as sent, or as PACT components left them
        return msgspec.json.encode({**fields, "messages": with_system_text(messages, self.prompt)})

    async def whole(self, content: bytes) -> bytes:
        """A passthrough answer read whole: its choices cut at the separator."""
        try:
            data = msgspec.json.decode(content)
        except (msgspec.DecodeError, RecursionError):
            return content  # not a completion: as it came, and the session's snapshot stands
        self.sections().completion(data)
        self.finish()
        return msgspec.json.encode(data)

    async def stream(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """A passthrough stream, relayed cut; the session keeps what the model wrote once the stream is whole."""
        async for chunk in self.sections().sse(chunks):
            yield chunk
        self.finish()

    # -- protocol mode ----------------------------------------------------------------------
    def protocol(self, conversation: Conversation, resolution: Resolution, prepared: Prepared) -> Prepared:
        """``prepared`` with the rules and the snapshot after the PagedContext, within the budget (blocking: in the paging thread)."""
        if self.enabled:
            messages = [*conversation.history, *([conversation.query] if conversation.query is not None else [])]
            links = conversation_links(conversation, resolution.links)
            self.link = "" if resolution.pinned else links[-1] if links else ""
            parent = resolution.found.id if resolution.found is not None else None
            self._load(prepared.session.id, [parent] if parent else (), messages, links if not resolution.pinned else [])
        return with_appendix(prepared, self.prompt)

    # -- the answer ------------------------------------------------------------------------
    def sections(self) -> Sections:
        """The gates for one upstream answer; what its choice 0 writes after the separator is noted here."""
        return Sections(self._note)

    def _note(self, context: str | None, separators: int, tool_calls: bool) -> None:
        """What a round's answer wrote: its context section, separators and whether it called tools."""
        if context is not None or self.written[0] is None:  # a later round without a section keeps an earlier one's
            self.written = (context, separators)
        self.tool_calls = tool_calls  # the last round's: the answer's

    def finish(self) -> None:
        """Read what the model wrote by the rules, and keep it as the session's snapshot; else the one shown stands."""
        context, separators = self.written
        if self.shown is None:  # disabled for this request: a section written anyway is taken out, not kept
            if context is not None:
                self._violated("context_while_disabled", "a context section while contextMode is disabled: taken out, not kept")
            return
        raw, problems = parse_context(context, separators)
        if context is None and self.tool_calls:
            problems = []  # a turn that only calls the client's tools leaves the snapshot as it was, rightly
        snapshot = self.shown
        if raw is not None:
            reading = read_snapshot(raw, self.shown, self.shown, self.hybrid.limits)
            snapshot, problems = reading.snapshot, [*problems, *reading.violations]
        broken = check(snapshot, self.hybrid.limits)
        if broken:  # not expected: the rules make what they keep whole; the snapshot shown stands
            log.error("session %s: the snapshot read breaks its own rules (%s); the one shown is kept", self.session_id, "; ".join(broken))
            snapshot = self.shown
        for problem in problems:
            self._violated(problem.rule, problem.text)
        self.hybrid.metrics.inc("pcp_context_rounds_total", outcome="read" if raw is not None and not broken else "kept")
        self._keep(snapshot)

    def _keep(self, snapshot: Snapshot) -> None:
        """``snapshot`` kept as the session's state (and the scope's core blocks with it)."""

        def step(current: HybridState | None) -> HybridState:
            """The session's new state: this snapshot, with what the API set meanwhile."""
            todo = current.todo if current is not None else ()  # set by the API meanwhile: the client's
            link = self.link or (current.link if current is not None else "")
            rounds = max(self.round, current.round if current is not None else 0)
            given = tuple(block.id for block in snapshot.memory.core) if self.scope else ()
            return HybridState(
                snapshot=snapshot, round=rounds, startup_at=self.startup_at, todo=todo, cold=kept_cold(snapshot, self.cold), link=link, given=given
            )

        self.hybrid.store.change(self.namespace, self.session_id, step)
        if self.hybrid.memory is not None and self.scope:
            self.hybrid.memory.keep(self.scope, snapshot.memory.core, self.seen)

    def _violated(self, rule: str, text: str) -> None:
        """Count a broken rule, and log what broke it."""
        self.hybrid.metrics.inc("pcp_context_violations_total", rule=rule)
        log.debug("session %s round %d: %s", self.session_id, self.round, text)


# The snapshot with nothing in it: what the rules cost without memory, to measure the room left for it.
_EMPTY = Snapshot(runtime=Runtime(round=1, workspace="", datetime="2026-01-01T00:00:00.000Z", startup_at=0), todo=Todo(summary="no todo", total=0, step=0))
