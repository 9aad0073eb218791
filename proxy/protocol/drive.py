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
from collections.abc import AsyncIterator, Generator
from functools import partial
from typing import TYPE_CHECKING, Any

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
    rounds,
    solidified_session,
    stored_pages,
    with_frame,
)

from .. import headers as pcp
from ..errors import ClientError, PcpError
from .calls import UpstreamCalls
from .context import DenseRecall, PagedRequest, SessionSave
from .interrupt import Interrupt, Stopped
from .streaming import StreamedRound

if TYPE_CHECKING:
    from ..apis.codec import Codec
    from ..metrics import Metrics
    from ..services import Services

__all__ = ["keep_pages", "serve_protocol"]

Rounds = Generator[Effect, Any, Outcome]

log = logging.getLogger("pcp.drive")


async def serve_protocol(paged: PagedRequest) -> Response[Any]:
    """The request's rounds driven to its answer, within ``request_timeout``."""
    services = paged.services
    request = ProtocolRequest(paged)
    with request.dense.serving():
        try:  # until the response starts; a stream relayed after it keeps to the same deadline
            async with asyncio.timeout(services.settings.request_timeout):
                return await (request.stream() if paged.codec.streamed else request.complete())
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
    request = ProtocolRequest(PagedRequest.bare(services, codec, conversation, headers, namespace, policy))
    prepared = await request.paging()
    request.save.first(prepared, request.resolution)
    await request.save.stored(always=True)
    return request.save.session_id(prepared)


class ProtocolRequest:
    """One client request in protocol mode: its session, its rounds and its worker calls."""

    def __init__(self, paged: PagedRequest):
        self.paged = paged
        self.services = services = paged.services
        self.headers = {**paged.headers, pcp.ROLE: "worker", "content-type": "application/json"}
        self.headers.pop("accept-encoding", None)
        self.dense = DenseRecall(services.embedder, self.headers)
        self.prepared: Prepared | None = None
        self.resolution = Resolution()  # the session the store found, and its version
        self.save = SessionSave(services.sessions, paged.namespace, paged.conversation, paged.pinned)
        # The answering round's headers are the latest worker call's, in the end.
        deadline = time.monotonic() + services.settings.request_timeout
        self.calls = UpstreamCalls(services, paged.codec, self.headers, deadline, paged.hooks)
        self.usage = self.calls.usage

    def response_headers(self, rounds: int) -> dict[str, str]:
        """The answering round's upstream headers (its request id, rate limits), and the proxy's own."""
        session = self.save.session_id(self.prepared)
        headers = {**self.calls.answered, pcp.MODE: "protocol", pcp.ROUNDS: str(rounds), pcp.SESSION: session}
        headers.update(self.paged.telemetry.headers())  # x-pcp-tokens-saved, x-pcp-pages, x-pcp-consulted, x-pcp-trace
        for hook in self.paged.hooks:  # x-pcp-components, x-pcp-context-round
            headers.update(hook.headers())
        return headers

    # -- before round 0 ----------------------------------------------------------------
    async def start(self) -> Rounds:
        """The request's rounds, its session found and paged on."""
        services, paged = self.services, self.paged
        if self.dense.on and paged.conversation.query_text:
            # Encoded while the history is paged and scored by BM25 (torch leaves the interpreter
            # while it computes, an upstream call leaves the loop); dense recall waits for it (``fulfil``).
            self.dense.encode(asked(paged.conversation, paged.policy.paging, services.tokenizer.count))
        prepared = await self.paging()
        if services.keys_prompt_cache(self.calls.upstream):
            paged.codec.cache_key(services.namespaces.cache_key(paged.namespace, prepared.session.id))
        paged.telemetry.priced(self._untouched_read(), self.usage)
        if self.calls.upstream is services.upstream:  # model summaries ask for chat completions
            await services.summary_writer.submit(prepared.session.pages, paged.codec.model, self.headers)
        # Each worker call's synthesis is recorded, each upstream call timed. The rounds' index of a
        # long history is built in a thread, as their steps run (``_step``).
        generator = await asyncio.to_thread(rounds, prepared, services.tokenizer.count_built, services.bm25)
        return paged.telemetry.watch(prepared, generator)

    def _untouched_read(self) -> int:
        """What a provider's cache would serve of the request sent untouched: all but its latest exchange, which
        the client sent before (through the proxy, forwarded or paged), counted as the client's. The most it may
        be: a saving claimed against it is never one that did not happen."""
        conversation, count = self.paged.conversation, self.services.tokenizer.count
        sent_before = conversation.sent_before
        if not sent_before:
            return 0
        new = [*conversation.history[sent_before:], *filter(None, [conversation.query])]
        message_tokens = self.paged.telemetry.message_tokens
        if message_tokens:  # what the request's messages take, less the new ones: a million-token
            # history is not counted again, message by message
            return message_tokens - prompt_tokens(new, count) + prompt_tokens([], count)
        return prompt_tokens([*conversation.head, *conversation.history[:sent_before]], count)

    async def paging(self) -> Prepared:
        """The request paged (``_prepare``) in a thread, the pages its extensions and the sessions behind it bring beside
        its own; stopped if the client leaves or it takes longer than ``paging_timeout``."""
        pages = await self._behind()
        for hook in self.paged.hooks:
            pages += await hook.pages(self.paged.conversation, self._ask_router)
        interrupt = Interrupt(self.services.settings.paging_timeout)
        try:
            self.prepared = prepared = await interrupt.run(lambda: self._prepare(interrupt, pages))
        except Stopped:
            self.services.metrics.inc("pcp_paging_stopped_total", reason="paging_timeout")
            raise ClientError(
                f"paging this history ({len(self.paged.conversation.history):,} messages) took longer than paging_timeout allows ({self.services.settings.paging_timeout:g} s): send a shorter history, or raise PCP_PAGING_TIMEOUT",
                status=413,
                code="paging_timeout",
            ) from None
        except asyncio.CancelledError:
            self.services.metrics.inc("pcp_paging_stopped_total", reason="cancelled")
            raise
        _count_paging(self.services.metrics, prepared)
        return prepared

    def _prepare(self, checkpoint: Checkpoint, pages: list[Page]) -> Prepared:
        """Find the session (the store may read the disk), then page what it does not hold; the extensions change it then."""
        services, paged = self.services, self.paged
        self.resolution = resolution = services.sessions.resolve(paged.namespace, paged.conversation, paged.pinned)
        facts = Facts(
            namespace=paged.namespace,
            now_ns=time.time_ns(),
            client_tools=paged.codec.client_tools,
            dense=self.dense.on,
            summaries=services.summary_writer.landed,
            memory=pages,
        )
        prepared = prepare(paged.conversation, resolution, paged.policy, facts, services.tokenizer.count, checkpoint)
        for hook in paged.hooks:  # PACT's components placed in its pages; Hybrid mode's rules and snapshot after the PagedContext
            prepared = hook.prepared(paged.conversation, resolution, prepared)
        return prepared

    # -- the rounds ----------------------------------------------------------------------
    async def advance(self, generator: Rounds, value: Any) -> CallWorker | Outcome:
        """Send ``value`` into the rounds and fulfil effects until they want the worker or are done.

        Each step runs in a thread: ranking and synthesis over a long history take tens of
        milliseconds of CPU, which on the event loop every other request would wait for.
        """
        prepared = self.prepared
        assert prepared, "the rounds start once the request is paged"
        if value is not None:  # a worker answered: the session is kept (a request the upstream refused keeps nothing)
            self.save.first(prepared, self.resolution)
        effect = await asyncio.to_thread(_step, generator, value)
        while not isinstance(effect, (CallWorker, Outcome)):
            effect = await asyncio.to_thread(_step, generator, await self.fulfil(effect))
        if isinstance(effect, Outcome):
            self._keep_what_it_leaves(prepared, effect)
            self.paged.telemetry.ended(effect, prepared)  # the request ends: its trace kept, counted, logged
            return effect
        if not self.save.sent:  # round 0: the next request keeps what still ranks of it
            self.prepared = with_frame(prepared, effect)
        return effect

    async def fulfil(self, effect: Similarity | CallRouter | LoadPages) -> Any:
        """What an effect of the rounds asks the host for: the router's reply, a container's pages, similarities."""
        if isinstance(effect, CallRouter):
            return await self.calls.router(effect)
        if isinstance(effect, LoadPages):  # a page fault: the memory container the worker opens
            return [page for hook in self.paged.hooks for page in await hook.load(effect.ids)]
        return await self.dense.similarities(effect.query, effect.texts)

    async def _ask_router(self, messages: list[dict[str, Any]], role: str) -> str | None:
        """The router model's reply to ``messages``, asked under ``role``."""
        return await self.calls.router(CallRouter(messages), role=role)

    async def _behind(self) -> list[Page]:
        """The pages of the sessions the request reads beside its own (``behind``), as pages from storage: before
        its history in time, ranked and Consulted as its own are. A session the store no longer holds adds none."""
        if not self.paged.behind:
            return []
        sessions, namespace = self.services.sessions, self.paged.namespace
        found = await asyncio.to_thread(lambda: [sessions.read(namespace, session_id) for session_id in self.paged.behind])
        return [page for session in filter(None, found) for page in stored_pages(session.pages)]

    def _keep_what_it_leaves(self, prepared: Prepared, outcome: Outcome) -> None:
        """Keep what the request leaves: the formal pages its drafts were solidified into (§VI.5), and what its extensions keep."""
        self.save.first(prepared, self.resolution)  # the session's first write goes first
        session = solidified_session(prepared, outcome)
        for hook in self.paged.hooks:  # Hybrid mode's snapshot; memory, written back in the background
            hook.settled(session, self.paged.conversation, outcome)
        if session is not prepared.session:
            self.save.solidified(session)
            self.services.metrics.inc("pcp_pages_solidified_total", len(session.pages.storage) - len(prepared.session.pages.storage))

    async def _answered(self) -> str:
        """Once the session is stored as the answer needs it: its id, told to the codec (an answer may carry it)."""
        await self.save.stored()
        session_id = self.save.session_id(self.prepared)
        self.paged.codec.kept(session_id, self.paged.behind)
        return session_id

    # -- non-streaming -------------------------------------------------------------------
    async def complete(self) -> Response[Any]:
        """The answer whole, once the last round has answered."""
        data, outcome = await self._completed()
        await self._answered()
        body = json.dumps(self.paged.codec.final(data, outcome, self.usage)).encode()
        return Response(body, media_type="application/json", headers=self.response_headers(outcome.rounds))

    async def _completed(self) -> tuple[dict[str, Any], Outcome]:
        """The rounds, none of them streamed: the last completion and how the rounds ended."""
        generator = await self.start()
        step = await self.advance(generator, None)
        while isinstance(step, CallWorker):
            data = await self.calls.worker(step)
            step = await self.advance(generator, self.paged.codec.reply(data))
        return data, step

    # -- streaming -----------------------------------------------------------------------
    async def stream(self) -> Response[Any]:
        """The answer as the API's events: the answering round relayed as it is generated."""
        codec = self.paged.codec
        if codec.choices > 1:  # several answers are not relayed as they come: they arrive whole, as events
            data, outcome = await self._completed()
            await self._answered()
            return Stream(codec.events(codec.final(data, outcome, self.usage)), media_type="text/event-stream", headers=self.response_headers(outcome.rounds))
        generator = await self.start()
        step = await self.advance(generator, None)
        while isinstance(step, CallWorker):
            round_ = StreamedRound(step, partial(self.calls.worker_stream, step), codec.round(self.usage))
            first = await round_.until_committed()
            if first is not None and not round_.client_tool_calls(codec.client_tools):
                assert self.prepared  # the worker is answering: the session is kept before the answer starts
                self.save.first(self.prepared, self.resolution)
                await self._answered()
                return Stream(self._relay(round_, first, generator), media_type="text/event-stream", headers=self.response_headers(step.round + 1))
            step = await self.advance(generator, round_.reply(delivered=False))
        await self._answered()
        # A call of the client's own tools goes back as the upstream sent it.
        body = round_.api.replay(round_.events) if step.kind == "client_tool_calls" else self._relay(round_, step.text, None)
        return Stream(body, media_type="text/event-stream", headers=self.response_headers(step.rounds))

    async def _relay(self, round_: StreamedRound, first: str, generator: Rounds | None) -> AsyncIterator[bytes]:
        """The answer as the API's events: ``first``, then (with the rounds' ``generator``) the rest of the round as it comes."""
        api = round_.api
        yield api.opening()
        if first:
            yield api.text(first)
        if generator is not None:
            try:
                async for text in round_.rest():
                    yield api.text(text)
                # The rounds end (the session kept) before the stream does: a follow-up sent once it is done finds all of it.
                await self.advance(generator, round_.reply(delivered=True))
                await self.save.stored()
            except PcpError as error:
                yield api.failure(error)
                return
        for event in api.closing():
            yield event


def _step(generator: Rounds, value: Any) -> Effect | Outcome:
    """One step of the rounds: the next effect, or the outcome they end with (a thread cannot hand
    ``StopIteration`` to the event loop: a future refuses it)."""
    try:
        return generator.send(value)
    except StopIteration as done:
        return done.value


def _count_paging(metrics: Metrics, prepared: Prepared) -> None:
    """What paging found and built, counted."""
    paged = prepared.paged
    metrics.inc("pcp_sessions_total", how=paged.how)
    metrics.inc("pcp_turns_paged_total", paged.turns)
    metrics.inc("pcp_pages_built_total", paged.originals, type="Original")
    metrics.inc("pcp_pages_built_total", paged.consolidated, type="Consolidated")
