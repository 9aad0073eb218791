"""Protocol mode: the one loop that drives a request's rounds and fulfils their effects.

``pcp_core.request`` decides; this module only does the I/O around it: it
looks the session up, hands paging to a thread, calls the worker, router and
embedder when the rounds ask, saves what the request leaves, and speaks the
request's API to both sides through its codec (``codec``: ``chat``,
``responses``, ``messages``; ``chat_stream`` reads a streamed round). The loop
is the same for every API. Rounds that end in
directives are invisible to the client. For a streaming client the response
starts when a round commits to answering, so ``x-pcp-rounds`` is known by
then, and the rest of that round is relayed as it is generated.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Generator
from concurrent.futures import Future
from contextlib import nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Response
from litestar.response import Stream

from pcp_core import (
    CallRouter,
    CallWorker,
    Checkpoint,
    Conversation,
    Effect,
    Facts,
    LoadPages,
    Outcome,
    Page,
    Policy,
    Prepared,
    Resolution,
    Similarity,
    asked,
    prepare,
    prompt_tokens,
    remembered,
    rounds,
    settle,
    stored_pages,
)
from pcp_core.memory import memory_use

from .. import headers as pcp
from ..errors import ClientError, PcpError
from .calls import UpstreamCalls
from .interrupt import Interrupt, Stopped
from .streaming import StreamedRound
from .telemetry import RequestTelemetry

if TYPE_CHECKING:
    from ..apis.codec import Codec
    from ..memory.scopes import Scope
    from ..services import Services

__all__ = ["keep_pages", "serve_protocol"]

Rounds = Generator[Effect, Any, Outcome]

log = logging.getLogger("pcp.drive")


async def serve_protocol(
    services: Services,
    codec: Codec,
    conversation: Conversation,
    headers: dict[str, str],
    namespace: str,
    pinned: str | None,
    *,
    policy: Policy | None = None,
    telemetry: RequestTelemetry | None = None,
    memory: Scope | None = None,
    behind: list[str] | None = None,
) -> Response[Any]:
    """``policy``: the request's (``proxy.protocol.control``), else the settings'; ``telemetry`` follows it (``proxy.protocol.telemetry``);
    ``memory``: the request's memory scope (``proxy.memory``); ``behind``: sessions of the caller whose pages the
    request reads beside its own (those a compaction it carries stands for, ``web.context_management``)."""
    request = ProtocolRequest(services, codec, conversation, headers, namespace, pinned, policy, telemetry, memory, behind)
    # Encoding history texts in the background would take the interpreter from this request.
    with services.embedder.serving() if services.embedder is not None else nullcontext():
        try:  # until the response starts; a stream relayed after it keeps to the same deadline
            async with asyncio.timeout(services.settings.request_timeout):
                return await (request.stream() if codec.streamed else request.complete())
        except TimeoutError:
            raise PcpError(
                f"the request took longer than request_timeout allows ({services.settings.request_timeout:g} s)",
                status=504,
                type="timeout",
                code="request_timeout",
            ) from None


async def keep_pages(services: Services, codec: Codec, conversation: Conversation, headers: dict[str, str], namespace: str, policy: Policy) -> str:
    """The conversation's history paged into its session and kept, with no worker call (a compaction's): the session's id,
    once the store holds it."""
    request = ProtocolRequest(services, codec, conversation, headers, namespace, None, policy)
    request.prepared = prepared = await request._paged()
    request._count_paging(prepared)
    request._save_once()
    if request.kept is not None:
        kept = await asyncio.wrap_future(request.kept)
        if kept is not None:
            request.session_id = kept.session.id
    return request.session_id or prepared.session.id


class ProtocolRequest:
    """One client request in protocol mode: its session, its rounds and its worker calls."""

    def __init__(
        self,
        services: Services,
        codec: Codec,
        conversation: Conversation,
        headers: dict[str, str],
        namespace: str,
        pinned: str | None,
        policy: Policy | None = None,
        telemetry: RequestTelemetry | None = None,
        memory: Scope | None = None,
        behind: list[str] | None = None,
    ):
        self.services = services
        self.behind = behind or []
        self.policy = policy or services.policy
        self.telemetry = telemetry or _telemetry(services, conversation, namespace, codec.model)
        self.codec = codec
        self.conversation = conversation
        self.headers = {**headers, pcp.ROLE: "worker", "content-type": "application/json"}
        self.headers.pop("accept-encoding", None)
        self.namespace = namespace
        self.pinned = pinned
        self.prefetch: Awaitable[Any] | None = None  # the query's vector, encoding
        self.prepared: Prepared | None = None
        self.resolution: Resolution | None = None  # the session the store found, and its version
        self.kept: Future[Any] | None = None  # the session's save (``SessionStore.save``): what the store kept
        self.session_id = ""  # the session as the store keeps it (a concurrent request may have kept the request's id first)
        self.unsaved = True
        self.known = True  # whether ``session_id`` is known before the store has kept the session (``SessionStore.keep``)
        self.memory = memory  # the request's memory scope (``proxy.memory``)
        # Hybrid mode (``proxy.hybrid``): None unless it is on; it reads chat completions.
        self.context = services.hybrid.begin(headers, namespace, memory.key if memory is not None else None) if codec.api.chat_body else None
        self.recalled: list[Page] = []  # memory's pages for the request
        self.behind_pages: list[Page] = []  # the pages of the sessions it reads beside its own (``behind``)
        # The answering round's headers are the latest worker call's, in the end.
        self.calls = UpstreamCalls(services, codec, self.headers, time.monotonic() + services.settings.request_timeout, self.context)
        self.usage = self.calls.usage

    def response_headers(self, rounds: int) -> dict[str, str]:
        """The answering round's upstream headers (its request id, rate limits), and the proxy's own."""
        session = self.session_id or (self.prepared.session.id if self.prepared is not None else "")
        headers = {**self.calls.answered, pcp.MODE: "protocol", pcp.ROUNDS: str(rounds), pcp.SESSION: session}
        if self.prepared is not None and self.prepared.components is not None:
            headers[pcp.COMPONENTS] = str(self.prepared.components)
        headers.update(self.telemetry.headers())  # x-pcp-tokens-saved, x-pcp-pages, x-pcp-consulted, x-pcp-trace
        if self.context is not None:
            headers.update(self.context.response_headers())
        return headers

    # -- before round 0 ----------------------------------------------------------------
    async def start(self) -> Rounds:
        """The request's rounds, its session found and paged on."""
        services = self.services
        embedder = services.embedder
        if embedder is not None and self.conversation.query_text:
            # Encoded while the history is paged and scored by BM25 (torch leaves the interpreter
            # while it computes, an upstream call leaves the loop); dense recall waits for it (``fulfil``).
            text = asked(self.conversation, self.policy.paging, services.tokenizer.count)
            self.prefetch = embedder.prefetch(text, self.headers)
        self.behind_pages, self.recalled = await self._behind(), await self._recall()
        self.prepared = prepared = await self._paged()
        self._count_paging(prepared)
        if self.services.keys_prompt_cache(self.calls.upstream):
            self.codec.cache_key(services.namespaces.cache_key(self.namespace, prepared.session.id))
        self.telemetry.priced(self._untouched_read(), self.usage)
        writer = services.summary_writer
        if writer is not None and self.calls.upstream is services.upstream:  # it asks for chat completions
            await writer.submit(prepared.session.pages, self.codec.model, self.headers)
        # Each worker call's synthesis is recorded, each upstream call timed. The rounds' index of a
        # long history is built in a thread, as their steps run (``_step``).
        loop = await asyncio.to_thread(rounds, prepared, services.tokenizer.count_built, services.bm25)
        return self.telemetry.watch(prepared, loop)

    def _untouched_read(self) -> int:
        """What a provider's cache would serve of the request sent untouched: all but its latest exchange, which
        the client sent before (through the proxy, forwarded or paged), counted as the client's. The most it may
        be: a saving claimed against it is never one that did not happen."""
        conversation, count = self.conversation, self.services.tokenizer.count
        sent_before = conversation.sent_before
        if not sent_before:
            return 0
        new = [*conversation.history[sent_before:], *filter(None, [conversation.query])]
        if self.telemetry.said:  # what the request's messages take, less the new ones: a million-token
            # history is not counted again, message by message
            return self.telemetry.said - prompt_tokens(new, count) + prompt_tokens([], count)
        return prompt_tokens([*conversation.head, *conversation.history[:sent_before]], count)

    async def _paged(self) -> Prepared:
        """``_prepare`` in a thread, stopped if the client leaves or it takes longer than ``paging_timeout``."""
        interrupt = Interrupt(self.services.settings.paging_timeout)
        try:
            return await interrupt.run(lambda: self._prepare(interrupt))
        except Stopped:
            self.services.metrics.inc("pcp_paging_stopped_total", reason="paging_timeout")
            raise ClientError(
                f"paging this history ({len(self.conversation.history):,} messages) took longer than paging_timeout allows ({self.services.settings.paging_timeout:g} s): send a shorter history, or raise PCP_PAGING_TIMEOUT",
                status=413,
                code="paging_timeout",
            ) from None
        except asyncio.CancelledError:
            self.services.metrics.inc("pcp_paging_stopped_total", reason="cancelled")
            raise

    def _prepare(self, checkpoint: Checkpoint) -> Prepared:
        """Find the session (the store may read the disk), then page what it does not hold."""
        services = self.services
        self.resolution = resolution = services.sessions.resolve(self.namespace, self.conversation, self.pinned)
        facts = Facts(
            namespace=self.namespace,
            now_ns=time.time_ns(),
            client_tools=self.codec.client_tools,
            dense=services.embedder is not None,
            summaries=services.summary_writer.landed if services.summary_writer is not None else {},
            memory=[*self.behind_pages, *self.recalled],
        )
        prepared = prepare(self.conversation, resolution, self.policy, facts, services.tokenizer.count, checkpoint)
        # The session's PACT components, placed in its pages (``proxy.pact.components``).
        prepared = services.components.attach(self.namespace, self.conversation, resolution, prepared, self.codec.components)
        # Hybrid mode: the rules and the session's snapshot after the PagedContext, within the budget.
        return self.context.protocol(self.conversation, resolution, prepared) if self.context is not None else prepared

    def _count_paging(self, prepared: Prepared) -> None:
        metrics, paged = self.services.metrics, prepared.paged
        metrics.inc("pcp_sessions_total", how=paged.how)
        metrics.inc("pcp_turns_paged_total", paged.turns)
        metrics.inc("pcp_pages_built_total", paged.originals, type="Original")
        metrics.inc("pcp_pages_built_total", paged.consolidated, type="Consolidated")

    # -- the rounds ----------------------------------------------------------------------
    async def advance(self, loop: Rounds, value: Any) -> CallWorker | Outcome:
        """Send ``value`` into the rounds and fulfil effects until they want the worker or are done.

        Each step runs in a thread: ranking and synthesis over a long history take tens of
        milliseconds of CPU, which on the event loop every other request would wait for.
        """
        if value is not None:  # a worker answered: the session is kept (a request the upstream refused keeps nothing)
            self._save_once()
        effect = await asyncio.to_thread(_step, loop, value)
        while not isinstance(effect, (CallWorker, Outcome)):
            effect = await asyncio.to_thread(_step, loop, await self.fulfil(effect))
        if isinstance(effect, Outcome):
            self._settle(effect)
            self.telemetry.ended(effect, self.prepared)  # the request ends: its trace kept, counted, logged
            return effect
        if self.unsaved and self.prepared is not None:  # round 0: the next request keeps what still ranks of it
            self.prepared = remembered(self.prepared, effect)
        return effect

    async def fulfil(self, effect: Similarity | CallRouter | LoadPages) -> Any:
        if isinstance(effect, CallRouter):
            return await self.calls.router(effect)
        if isinstance(effect, LoadPages):  # a page fault: the memory container the worker opens
            memory = self.services.memory
            return await memory.load(self.memory.key, effect.ids) if memory is not None and self.memory is not None else []
        embedder = self.services.embedder
        if embedder is None:
            return None
        if self.prefetch is not None:
            await _quietly(self.prefetch)
        return await _quietly(embedder.similarities_when_ready(effect.query, effect.texts, self.headers))

    async def _behind(self) -> list[Page]:
        """The pages of the sessions the request reads beside its own (``behind``), as pages from storage: before
        its history in time, ranked and Consulted as its own are. A session the store no longer holds adds none."""
        if not self.behind:
            return []
        sessions = self.services.sessions
        found = await asyncio.to_thread(lambda: [sessions.read(self.namespace, session_id) for session_id in self.behind])
        return [page for session in found if session is not None for page in stored_pages(session.pages)]

    async def _recall(self) -> list[Page]:
        """The pages the Memory Router picks from the request's scope (none without one, or when it holds none)."""
        memory, scope = self.services.memory, self.memory
        if memory is None or scope is None or not memory.has_pages(scope.key):
            return []
        ask = (lambda messages: self.calls.router(CallRouter(messages), role="memory-router")) if self.services.settings.router_model else None
        return await memory.recall(scope.key, self.conversation, time.time_ns(), ask)

    def _save_once(self) -> None:
        """Send the session to the store, once: when the first worker call has answered (one the upstream
        refused keeps nothing), while the next round computes, so that writing a long history does not hold
        the interpreter meanwhile."""
        if self.unsaved and self.prepared is not None and self.resolution is not None:
            self.unsaved = False
            prepared, found = self.prepared, self.resolution.found
            # Conditional on the version the request read, when it goes on with the session it found.
            base = self.resolution.version if found is not None and found.id == prepared.session.id else ""
            saved = self.services.sessions.keep(
                self.namespace, prepared.session, prepared.new_links, self.conversation.chained, base=base, pinned=self.pinned is not None
            )
            # The id the session is kept under: a branch that a concurrent request left its session's id to goes on in its own.
            self.kept, self.session_id, self.known = saved.kept, saved.id, saved.known

    async def _stored(self) -> None:
        """With a shared store, until the session's saves are in it: a follow-up on another process finds them, and
        an answer is complete only once what it paged is kept (a store lost meanwhile is the client's 503). With
        a store of its own, only when the id the session is kept under is not known before (``SessionStore.keep``)."""
        if self.kept is None or (not self.services.sessions.shared and self.known):
            return
        kept = await asyncio.wrap_future(self.kept)
        if kept is not None:
            self.session_id = kept.session.id

    def _settle(self, outcome: Outcome) -> None:
        """Keep what the request leaves: the formal pages its drafts were solidified into (§VI.5)."""
        if self.context is not None:
            self.context.finish()  # the answer's snapshot, read and kept
        prepared = self.prepared
        if prepared is None:
            return
        self._save_once()  # the session's first write goes first
        session = settle(prepared, outcome)
        if self.memory is not None and self.services.memory is not None:  # written back in the background
            self.services.memory.write_back(self.memory.key, session, self.conversation, time.time_ns(), memory_use(self.recalled, outcome))
        if session is not prepared.session:
            if self.session_id and self.session_id != session.id:  # the first save went on under another id
                session = msgspec.structs.replace(session, id=self.session_id)
            self.kept = self.services.sessions.save(self.namespace, session, 0, after=self.kept)
            self.services.metrics.inc("pcp_pages_solidified_total", len(session.pages.storage) - len(prepared.session.pages.storage))

    # -- non-streaming -------------------------------------------------------------------
    async def complete(self) -> Response[Any]:
        data, outcome = await self._completed()
        await self._stored()
        self.codec.kept(self.session_id or (self.prepared.session.id if self.prepared is not None else ""), self.behind)
        return Response(
            json.dumps(self.codec.final(data, outcome, self.usage)).encode(), media_type="application/json", headers=self.response_headers(outcome.rounds)
        )

    async def _completed(self) -> tuple[dict[str, Any], Outcome]:
        """The rounds, none of them streamed: the last completion and how the loop ended."""
        loop = await self.start()
        step = await self.advance(loop, None)
        while isinstance(step, CallWorker):
            data = await self.calls.worker(step)
            step = await self.advance(loop, self.codec.reply(data))
        return data, step

    # -- streaming -----------------------------------------------------------------------
    async def stream(self) -> Response[Any]:
        codec = self.codec
        if codec.choices > 1:  # several answers are not relayed as they come: they arrive whole, as events
            data, outcome = await self._completed()
            await self._stored()
            self.codec.kept(self.session_id, self.behind)
            return Stream(codec.events(codec.final(data, outcome, self.usage)), media_type="text/event-stream", headers=self.response_headers(outcome.rounds))
        loop = await self.start()
        step = await self.advance(loop, None)
        while isinstance(step, CallWorker):
            round_ = StreamedRound(step, partial(self.calls.worker_stream, step), codec.round(self.usage))
            first = await round_.until_committed()
            if first is not None and not round_.client_tool_calls(codec.client_tools):
                self._save_once()  # the worker is answering: the session is kept before the answer starts
                await self._stored()
                codec.kept(self.session_id, self.behind)
                return Stream(self._relay(round_, first, loop), media_type="text/event-stream", headers=self.response_headers(step.round + 1))
            step = await self.advance(loop, round_.reply(delivered=False))
        await self._stored()
        codec.kept(self.session_id, self.behind)
        # A call of the client's own tools goes back as the upstream sent it.
        body = round_.api.replay(round_.events) if step.kind == "client_tool_calls" else self._relay(round_, step.text, None)
        return Stream(body, media_type="text/event-stream", headers=self.response_headers(step.rounds))

    async def _relay(self, round_: StreamedRound, first: str, loop: Rounds | None) -> AsyncIterator[bytes]:
        """The answer as the API's events: ``first``, then (with ``loop``) the rest of the round as it comes."""
        api = round_.api
        yield api.opening()
        if first:
            yield api.text(first)
        if loop is not None:
            try:
                async for text in round_.rest():
                    yield api.text(text)
                # The rounds end (the session kept) before the stream does: a follow-up sent once it is done finds all of it.
                await self.advance(loop, round_.reply(delivered=True))
                await self._stored()
            except PcpError as error:
                yield api.failure(error)
                return
        for event in api.closing():
            yield event


def _step(loop: Rounds, value: Any) -> Effect | Outcome:
    """One step of the rounds: the next effect, or the outcome they end with (a thread cannot hand
    ``StopIteration`` to the event loop: a future refuses it)."""
    try:
        return loop.send(value)
    except StopIteration as done:
        return done.value


async def _quietly(work: Awaitable[Any]) -> Any:
    """``work``'s result, or None if it fails: dense recall is worth having, never worth a failed request."""
    try:
        return await work
    except Exception:
        log.exception("dense recall is skipped for this request")
        return None


def _telemetry(services: Services, conversation: Conversation, namespace: str, model: str | None) -> RequestTelemetry:
    """The telemetry of a request whose caller brings none: under the settings' policy."""
    said = [*conversation.head, *conversation.history, *filter(None, [conversation.query])]
    return RequestTelemetry(
        services.traces, services.metrics, namespace, model, prompt_tokens(said, services.tokenizer.count), services.controls.default, len(said)
    )
