"""Protocol mode: the one loop that drives a request's rounds and fulfils their effects.

``pcp_core.request`` decides; this module only does the I/O around it: it
looks the session up, hands paging to a thread, calls the worker, router and
embedder when the rounds ask, saves what the request leaves, and speaks the
chat API to the client (``chat``, ``chat_stream``). Rounds that end in
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
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from litestar import Response
from litestar.response import Stream

from pcp_core import CallRouter, CallWorker, Conversation, Effect, Facts, Outcome, Prepared, Similarity, asked, prepare, remembered, rounds, settle

from .chat import DONE, ChatCodec, Usage
from .chat_stream import StreamedRound
from .errors import PcpError, UpstreamError

if TYPE_CHECKING:
    from .app import Services

__all__ = ["serve_protocol"]

Rounds = Generator[Effect, Any, Outcome]
# A router model reranks; it is worth waiting for briefly, never for a whole generation.
ROUTER_TIMEOUT = 10.0
ROUTER_MAX_TOKENS = 80

log = logging.getLogger("pcp.drive")


async def serve_protocol(services: Services, body: dict[str, Any], conversation: Conversation, headers: dict[str, str], namespace: str, pinned: str | None) -> Response[Any]:
    request = ProtocolRequest(services, ChatCodec(body), conversation, headers, namespace, pinned)
    # Encoding history texts in the background would take the interpreter from this request.
    with services.embedder.serving() if services.embedder is not None else nullcontext():
        return await (request.stream() if body.get("stream") else request.complete())


class ProtocolRequest:
    """One client request in protocol mode: its session, its rounds and its worker calls."""

    def __init__(self, services: Services, codec: ChatCodec, conversation: Conversation, headers: dict[str, str], namespace: str, pinned: str | None):
        self.services = services
        self.codec = codec
        self.conversation = conversation
        self.headers = {**headers, "x-pcp-role": "worker", "content-type": "application/json"}
        self.headers.pop("x-pcp-session", None)  # ours, not the upstream's
        self.headers.pop("accept-encoding", None)
        self.namespace = namespace
        self.pinned = pinned
        self.prefetch: Awaitable[Any] | None = None  # the query's vector, encoding
        self.prepared: Prepared | None = None
        self.unsaved = True
        self.usage = Usage()

    def response_headers(self, rounds: int) -> dict[str, str]:
        session = self.prepared.session.id if self.prepared is not None else ""
        return {"x-pcp-mode": "protocol", "x-pcp-rounds": str(rounds), "x-pcp-session": session}

    # -- before round 0 ----------------------------------------------------------------
    async def start(self) -> Rounds:
        """The request's rounds, its session found and paged on."""
        services = self.services
        embedder = services.embedder
        if embedder is not None and self.conversation.query_text:
            # Encoded while the history is paged and scored by BM25 (torch leaves the interpreter
            # while it computes, an upstream call leaves the loop); dense recall waits for it (``fulfil``).
            text = asked(self.conversation, services.policy.paging, services.tokenizer.count)
            self.prefetch = embedder.prefetch(text, self.headers)
        self.prepared = prepared = await asyncio.to_thread(self._prepare)
        self._count_paging(prepared)
        summariser = services.summariser
        if summariser is not None:
            await summariser.submit(prepared.session.pages, self.codec.model, self.headers)
        return rounds(prepared, services.tokenizer.count_built, services.bm25)

    def _prepare(self) -> Prepared:
        """Find the session (the store may read the disk), then page what it does not hold."""
        services = self.services
        resolution = services.sessions.resolve(self.namespace, self.conversation, self.pinned)
        facts = Facts(
            namespace=self.namespace,
            now_ns=time.time_ns(),
            client_tools=self.codec.client_tools,
            dense=services.embedder is not None,
            summaries=services.summariser.landed if services.summariser is not None else {},
        )
        return prepare(self.conversation, resolution, services.policy, facts, services.tokenizer.count)

    def _count_paging(self, prepared: Prepared) -> None:
        metrics, paged = self.services.metrics, prepared.paged
        metrics.inc("pcp_sessions_total", how=paged.how)
        metrics.inc("pcp_turns_paged_total", paged.turns)
        metrics.inc("pcp_pages_built_total", paged.originals, type="Original")
        metrics.inc("pcp_pages_built_total", paged.consolidated, type="Consolidated")

    # -- the rounds ----------------------------------------------------------------------
    async def advance(self, loop: Rounds, value: Any) -> CallWorker | Outcome:
        """Send ``value`` into the rounds and fulfil effects until they want the worker or are done."""
        try:
            effect = loop.send(value)
            while not isinstance(effect, CallWorker):
                effect = loop.send(await self.fulfil(effect))
        except StopIteration as done:
            self._settle(done.value)
            return done.value
        if self.unsaved and self.prepared is not None:  # round 0: the next request keeps what still ranks of it
            self.prepared = remembered(self.prepared, effect.synthesis, self.services.policy)
        self._save_once()
        return effect

    async def fulfil(self, effect: Similarity | CallRouter) -> Any:
        if isinstance(effect, CallRouter):
            return await self.ask_router(effect)
        embedder = self.services.embedder
        if embedder is None:
            return None
        if self.prefetch is not None:
            await _quietly(self.prefetch)
        return await _quietly(embedder.similarities_when_ready(effect.query, effect.texts, self.headers))

    async def ask_router(self, call: CallRouter) -> str | None:
        """The router model's reply, or None: addressing works without it, so its failure fails nothing."""
        model = self.services.settings.router_model
        self.services.metrics.inc("pcp_upstream_calls_total", role="router")
        body = {"model": model, "messages": call.messages, "max_tokens": ROUTER_MAX_TOKENS, "temperature": 0}
        try:
            data = await self.services.upstream.complete(json.dumps(body).encode(), {**self.headers, "x-pcp-role": "router"}, timeout=ROUTER_TIMEOUT)
        except PcpError as error:
            log.warning("router model %s gave no ranking (status %s): %s", model, error.status, error)
            return None
        self.usage.add(data.get("usage"))
        return data["choices"][0]["message"].get("content") or ""

    def _save_once(self) -> None:
        """Send the session to the store, once: when the first worker call goes out, so that
        writing a long history does not hold the interpreter while this request computes."""
        if self.unsaved and self.prepared is not None:
            self.unsaved = False
            prepared = self.prepared
            self.services.sessions.save(self.namespace, prepared.session, prepared.new_links, self.conversation.chained)

    def _settle(self, outcome: Outcome) -> None:
        """Keep what the request leaves: the formal pages its drafts were solidified into (§VI.5)."""
        prepared = self.prepared
        if prepared is None:
            return
        self._save_once()  # the session's first write goes first
        session = settle(prepared, outcome)
        if session is not prepared.session:
            self.services.sessions.save(self.namespace, session, 0)
            self.services.metrics.inc("pcp_pages_solidified_total", len(session.pages.storage) - len(prepared.session.pages.storage))

    # -- non-streaming -------------------------------------------------------------------
    async def complete(self) -> Response[Any]:
        data, outcome = await self._completed()
        return Response(json.dumps(self.codec.final(data, outcome, self.usage)).encode(), media_type="application/json", headers=self.response_headers(outcome.rounds))

    async def _completed(self) -> tuple[dict[str, Any], Outcome]:
        """The rounds, none of them streamed: the last completion and how the loop ended."""
        loop = await self.start()
        step = await self.advance(loop, None)
        while isinstance(step, CallWorker):
            data = await self._call(step)
            step = await self.advance(loop, self.codec.reply(data))
        return data, step

    async def _call(self, call: CallWorker) -> dict[str, Any]:
        self.services.metrics.inc("pcp_upstream_calls_total", role="worker")
        data = await self.services.upstream.complete(self.codec.worker_body(call, stream=False), self.headers)
        self.usage.add(data.get("usage"))
        return data

    # -- streaming -----------------------------------------------------------------------
    async def stream(self) -> Response[Any]:
        codec = self.codec
        if codec.choices > 1:  # several answers are not relayed as they come: they arrive whole, as events
            data, outcome = await self._completed()
            return Stream(codec.events(codec.final(data, outcome, self.usage)), media_type="text/event-stream", headers=self.response_headers(outcome.rounds))
        loop = await self.start()
        step = await self.advance(loop, None)
        while isinstance(step, CallWorker):
            round_ = StreamedRound(step, lambda call=step: self._open_stream(call), self.usage, codec.model)
            first = await round_.until_committed()
            if first is not None and not round_.client_tool_calls(codec.client_tools):
                return Stream(self._relay(round_, first, loop), media_type="text/event-stream", headers=self.response_headers(step.round + 1))
            step = await self.advance(loop, round_.reply(delivered=False))
        # A call of the client's own tools goes back as the upstream sent it.
        body = round_.replay() if step.kind == "client_tool_calls" else self._relay(round_, step.text, None)
        return Stream(body, media_type="text/event-stream", headers=self.response_headers(step.rounds))

    async def _open_stream(self, call: CallWorker) -> AsyncIterator[dict[str, Any]]:
        upstream = self.services.upstream
        self.services.metrics.inc("pcp_upstream_calls_total", role="worker")
        response = await upstream.open("POST", "/chat/completions", content=self.codec.worker_body(call, stream=True), headers=self.headers)
        if response.status_code >= 400:
            raise UpstreamError.refused(response.status_code, await upstream.read(response), response.headers.get("content-type"))
        return upstream.sse_events(response)

    async def _relay(self, round_: StreamedRound, first: str, loop: Rounds | None) -> AsyncIterator[bytes]:
        """The answer as SSE: ``first``, then (with ``loop``) the rest of the round as it comes."""
        yield round_.chunk({"role": "assistant", "content": ""})
        if first:
            yield round_.chunk({"content": first})
        if loop is not None:
            try:
                async for text in round_.rest():
                    yield round_.chunk({"content": text})
            except PcpError as error:
                yield b"data: " + error.envelope() + b"\n\n"
                return
        yield round_.chunk({}, finish_reason="stop")
        if self.codec.include_usage:
            yield round_.event({"choices": [], "usage": self.usage.as_dict()})
        yield DONE
        if loop is not None:
            await self.advance(loop, round_.reply(delivered=True))


async def _quietly(work: Awaitable[Any]) -> Any:
    """``work``'s result, or None if it fails: dense recall is worth having, never worth a failed request."""
    try:
        return await work
    except Exception:
        log.exception("dense recall is skipped for this request")
        return None

