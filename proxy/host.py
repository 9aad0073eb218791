"""Protocol mode: page the history, drive the round engine, return one chat completion.

The engine (``pcp_core.engine``) decides; this module only fulfils its effects —
calls to the worker model — and speaks HTTP to both sides. Rounds that end in
directives are invisible to the client. For a streaming client the response
starts when a round commits to answering (``pcp_core.delivery``), so
``x-pcp-rounds`` is known by then, and the rest of that round is relayed as it
is generated.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Generator, Mapping
from contextlib import nullcontext
from functools import lru_cache
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
from litestar import Response
from litestar.response import Stream

from pcp_core.delivery import AnswerGate
from pcp_core.directives import parse_directives
from pcp_core.engine import DIRECTIVE_TOOLS, NO_ANSWER, CallRouter, CallWorker, Effect, Outcome, RoundContext, Similarity, WorkerReply, calls_client_tool, run_rounds
from pcp_core.index import PageIndex
from pcp_core.pages import Turn, iso_timestamp, short_hash
from pcp_core.pblock import PBlock, Scan, around_handle, block_handle, handle_line, scan
from pcp_core.sentry import PagedHistory, PagingPolicy, message_text, reopened_from
from pcp_core.session import SESSION_ID, Continuation, Session, chain_links, continuation, page_on, resume, transcript
from pcp_core.tokens import REPLY_PRIMING, message_tokens

from .errors import ProxyError
from .sessions import SessionStore, Transcript

if TYPE_CHECKING:
    from .app import Services

__all__ = ["Measured", "ProtocolRequest", "measure", "pinned_session", "run_protocol"]

HEAD_ROLES = ("system", "developer")
# Fields of the client's request that the proxy sets itself on worker calls.
OWN_FIELDS = ("messages", "stream", "stream_options", "n", "tools", "tool_choice")

Rounds = Generator[Effect, Any, Outcome]
PAGE_ID = attrgetter("id")
# A router model reranks; it is worth waiting for briefly, never for a whole generation.
ROUTER_TIMEOUT = 10.0
ROUTER_MAX_TOKENS = 80

log = logging.getLogger("pcp.host")


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def add(self, usage: dict[str, Any] | None) -> None:
        for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
            setattr(self, field, getattr(self, field) + int((usage or {}).get(field) or 0))


class Measured(msgspec.Struct, frozen=True):
    """A request's prompt tokens, and what its conversation was measured by."""

    tokens: int
    said: bytes  # the history's transcript
    history_tokens: int  # the prompt tokens of the history's messages
    continues: Session | None  # the recent session the history opens with, if one does


def measure(services: Services, messages: list[dict[str, Any]], namespace: str) -> Measured:
    """The prompt tokens of ``messages``: those of the history a recent session holds are known, not counted again."""
    count = services.tokenizer.count
    start = conversation_start(messages)
    history = messages[start:-1]
    said = transcript(history)
    continues, known = services.sessions.continued(namespace, said) or (None, Transcript(b"", 0))
    held = len(continues.chain) if continues is not None else 0
    history_tokens = known.tokens + sum(message_tokens(m, count) for m in history[held:])
    rest = sum(message_tokens(m, count) for m in (*messages[:start], *messages[start:][-1:]))  # the head and the query
    return Measured(tokens=REPLY_PRIMING + history_tokens + rest, said=said, history_tokens=history_tokens, continues=continues)


def conversation_start(messages: list[dict[str, Any]]) -> int:
    """Where the conversation starts: after the head, the leading system and developer messages."""
    return next((i for i, m in enumerate(messages) if m.get("role") not in HEAD_ROLES), len(messages))


class ProtocolRequest:
    """One client request in protocol mode: its parts, its pages, and its worker calls."""

    def __init__(self, services: Services, body: dict[str, Any], headers: dict[str, str], namespace: str, measured: Measured, pinned: str | None = None):
        self.services = services
        self.settings = services.settings
        self.body = body
        self.headers = {**headers, "x-pcp-role": "worker", "content-type": "application/json"}
        self.headers.pop("x-pcp-session", None)  # ours, not the upstream's
        self.headers.pop("accept-encoding", None)
        self.namespace = namespace
        self.pinned = pinned
        self.session = ""  # known once the history is paged
        self.prefetch: asyncio.Future[Any] | None = None  # the query's vector, encoding
        self.unsaved: tuple[Session, int] | None = None  # the session paged, and how many of its links are new
        self.paged: Session | None = None  # the session paged, once it is
        self.usage = Usage()
        self.measured = measured
        messages: list[dict[str, Any]] = body["messages"]
        n_head = conversation_start(messages)
        self.head = "\n\n".join(message_text(m) for m in messages[:n_head])
        # The conversation: what is paged. The head is kept as it is, so a system
        # prompt that changes (today's date in it, say) does not break the session.
        self.history = messages[n_head:-1]
        self.query = message_text(messages[-1]) if len(messages) > n_head else ""
        # A query too large for a prompt (a file pasted with its question) is a File block
        # too: the Query shows its start, its end and its handle; its drafts are addressed.
        self.query_block: PBlock | None = None
        self.query_turn: Turn | None = None
        self.asked = messages[-1]
        scanning = paging_policy(self.settings.block_tokens).blocks
        if scanning.is_block(self.query, services.tokenizer.count):
            self.query_turn = Turn(index=len(self.history), role=str(self.asked.get("role", "user")), text=self.query, timestamp=iso_timestamp(time.time()))
            self.query = handle_line(block_handle(self.query_turn), services.tokenizer.count(self.query), self.query, scanning)
        self.client_tools = list(body.get("tools") or [])
        self.choices = body.get("n") or 1  # answers the client asked for (checked when the body was read)
        self.base = {k: v for k, v in body.items() if k not in OWN_FIELDS}

    def response_headers(self, rounds: int) -> dict[str, str]:
        return {"x-pcp-mode": "protocol", "x-pcp-rounds": str(rounds), "x-pcp-session": self.session}

    def rounds(self, index: PageIndex) -> Rounds:
        settings = self.settings
        count = self.services.tokenizer.count_built
        tools = [*self.client_tools, *(DIRECTIVE_TOOLS if settings.directive_channel == "tools" else [])]
        context = RoundContext(
            query=self.query,
            head=self.head,
            current_time=iso_timestamp(time.time()),
            budget=settings.context_budget,
            max_rounds=settings.max_rounds,
            channel=settings.directive_channel,
            client_tools=self.client_tools,
            reserved_tokens=count(json.dumps(tools)) if tools else 0,
            dense=self.services.embedder is not None,
            router=bool(settings.router_model),
        )
        return run_rounds(context, index, count)

    async def page(self) -> PageIndex:
        """The history's pages: those of its session's known prefix, and the new messages paged."""
        # The query's vector is encoded while the history is paged and scored by BM25
        # (torch leaves the GIL while it computes); dense recall waits for it (``fulfil``).
        # Handed to a thread now, not in a task: a task would start only once paging has.
        embedder = self.services.embedder
        if embedder is not None and self.query:
            self.prefetch = asyncio.get_running_loop().run_in_executor(None, embedder.prefetch, around_handle(self.query)[1])
        session, known, reused, how, linked = await asyncio.to_thread(self._page_sync)
        consolidator = self.services.consolidator
        paged = session.pages
        if consolidator is not None:
            session.pages = consolidator.upgrade(paged)
        continued = how in ("resumed", "pinned")
        self.services.sessions.remember(self.namespace, session, linked)
        self.paged = session
        self.unsaved = (session, len(session.chain) - (reused if continued else 0))
        self._count_paging(known, paged, reused, how)
        if consolidator is not None:
            await consolidator.submit(session.pages, str(self.body.get("model", "")), self.headers)
        self.session = session.id
        return session.pages.index()

    def _page_sync(self) -> tuple[Session, PagedHistory, int, Continuation, Transcript]:
        """Find the session (blocking: the store may read the disk), then page what it does not hold.

        Also returns the transcript of the messages the session's chain now links.
        """
        chained = [*self.history, self.asked] if self.query_turn is not None else self.history
        found, reused, links = self._find(chained)
        chain = links[: len(self.history)]
        pinned = self.pinned is not None
        session = resume(found, reused, chain, iso_timestamp(time.time()), self.pinned or SessionStore.fresh_id(self.namespace, chain), pinned=pinned)
        how = continuation(found, reused, pinned=pinned)
        known = session.pages
        policy = paging_policy(self.settings.block_tokens)
        session.pages = page_on(session, self.history, reused, self.services.tokenizer.count, policy)
        measured = self.measured
        if self.query_turn is None:
            return session, known, reused, how, Transcript(measured.said, measured.history_tokens)
        self.query_block = scan(self.query_turn, self.services.tokenizer.count, policy.blocks)
        _hold(session, links[-1], self.query_turn, self.query_block)
        return session, known, reused, how, Transcript(transcript(chained), measured.history_tokens + message_tokens(self.asked, self.services.tokenizer.count))

    def _find(self, chained: list[dict[str, Any]]) -> tuple[Session | None, int, list[str]]:
        """The session this request continues, how many of ``chained`` it holds, and their links."""
        found = self.measured.continues if self.pinned is None else None  # found when the request was measured
        if found is not None:  # a follow-up: only its new messages are linked
            n = len(found.chain)
            return found, n, [*found.chain, *chain_links(chained[n:], after=found.chain[-1])]
        links = chain_links(chained)
        found, reused = self.services.sessions.resolve(self.namespace, links[: len(self.history)], self.pinned)
        return found, reused, links

    def _count_paging(self, known: PagedHistory, paged: PagedHistory, reused: int, how: Continuation) -> None:
        metrics = self.services.metrics
        metrics.inc("pcp_sessions_total", how=how)
        metrics.inc("pcp_turns_paged_total", paged.turns - reopened_from(known, reused))
        before = set(map(PAGE_ID, itertools.chain(known.leaves, known.containers)))
        for kind, pages in (("Original", paged.leaves), ("Consolidated", paged.containers)):
            metrics.inc("pcp_pages_built_total", len(set(map(PAGE_ID, pages)) - before), type=kind)

    def worker_body(self, call: CallWorker, stream: bool) -> bytes:
        body = {**self.base, "messages": call.messages}
        if call.tools:
            body["tools"] = call.tools
            if self.client_tools and "tool_choice" in self.body:
                body["tool_choice"] = self.body["tool_choice"]
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        elif self.choices > 1:
            body["n"] = self.choices  # choice 0 leads the rounds; the others answer with it (``_final``)
        return json.dumps(body).encode()

    async def open_worker(self, call: CallWorker) -> httpx.Response:
        """A streamed worker call."""
        self.services.metrics.inc("pcp_upstream_calls_total", role="worker")
        return await self.services.upstream.open("POST", "/chat/completions", content=self.worker_body(call, stream=True), headers=self.headers)

    async def ask_router(self, call: CallRouter) -> str | None:
        """The router model's reply, or None: addressing works without it, so its failure fails nothing."""
        model = self.settings.router_model
        self.services.metrics.inc("pcp_upstream_calls_total", role="router")
        body = {"model": model, "messages": call.messages, "max_tokens": ROUTER_MAX_TOKENS, "temperature": 0}
        try:
            data = await self.services.upstream.complete(json.dumps(body).encode(), {**self.headers, "x-pcp-role": "router"}, timeout=ROUTER_TIMEOUT)
        except ProxyError as error:
            log.warning("router model %s gave no ranking (status %s): %s", model, error.status, error)
            return None
        self.usage.add(data.get("usage"))
        return data["choices"][0]["message"].get("content") or ""

    async def advance(self, loop: Rounds, value: Any) -> CallWorker | Outcome:
        """Send ``value`` into the engine and fulfil effects until it wants the worker or is done."""
        try:
            effect = loop.send(value)
            while not isinstance(effect, CallWorker):
                effect = loop.send(await self.fulfil(effect))
        except StopIteration as done:
            self._keep(done.value)
            return done.value
        self._save()
        return effect

    def _save(self) -> None:
        """Send the session to disk, once: when the first worker call goes out, so the
        encoding of a long history does not hold the interpreter while this request computes."""
        if self.unsaved is not None:
            session, new_links = self.unsaved
            self.unsaved = None
            self.services.sessions.save(self.namespace, session, new_links)

    def _keep(self, outcome: Outcome) -> None:
        """Keep in the session the formal pages this request's drafts were solidified into (§VI.5)."""
        session = self.paged
        if session is None:
            return
        pages = session.pages
        known = {page.id for page in pages.storage}
        new = [page for page in outcome.solidified if page.id not in known]
        if new:
            self._save()  # the session's first write goes first
            session.pages = msgspec.structs.replace(pages, storage=[*pages.storage, *new])
            self.services.sessions.save(self.namespace, session, 0)
            self.services.metrics.inc("pcp_pages_solidified_total", len(new))

    async def fulfil(self, effect: Similarity | CallRouter) -> Any:
        if isinstance(effect, CallRouter):
            return await self.ask_router(effect)
        embedder = self.services.embedder
        if embedder is None:
            return None
        if self.prefetch is not None:
            await self._quietly(self.prefetch)
        return await self._quietly(embedder.similarities_when_ready(effect.query, effect.texts))

    @staticmethod
    async def _quietly(work: Awaitable[Any]) -> Any:
        """``work``'s result, or None if it fails: dense recall is worth having, never worth a failed request."""
        try:
            return await work
        except Exception:
            log.exception("dense recall is skipped for this request")
            return None

    # -- non-streaming ----------------------------------------------------------------
    async def complete(self) -> Response[Any]:
        data, outcome = await self._completed()
        return Response(json.dumps(self._final(data, outcome)).encode(), media_type="application/json", headers=self.response_headers(outcome.rounds))

    async def _completed(self) -> tuple[dict[str, Any], Outcome]:
        """The rounds, none of them streamed: the last completion and how the loop ended."""
        loop = self.rounds(await self.page())
        step = await self.advance(loop, None)
        while isinstance(step, CallWorker):
            data = await self._call(step)
            message = data["choices"][0]["message"]
            step = await self.advance(loop, WorkerReply(text=message.get("content") or "", tool_calls=message.get("tool_calls") or []))
        return data, step

    async def _call(self, call: CallWorker) -> dict[str, Any]:
        self.services.metrics.inc("pcp_upstream_calls_total", role="worker")
        data = await self.services.upstream.complete(self.worker_body(call, stream=False), self.headers)
        self.usage.add(data.get("usage"))
        return data

    def _final(self, data: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
        """The completion the client gets: the answer (with ``n``, one per choice), the usage of every call."""
        if outcome.kind == "answer":
            first, *others = data["choices"]
            answers = [(first, outcome.text), *((choice, _spoken(choice)) for choice in others[: self.choices - 1])]
            data["choices"] = [_answer(choice, i, text) for i, (choice, text) in enumerate(answers)]
        data["usage"] = msgspec.to_builtins(self.usage)
        return data

    # -- streaming --------------------------------------------------------------------
    async def stream(self) -> Response[Any]:
        if self.choices > 1:  # several answers are not relayed as they come: they arrive whole, as events
            data, outcome = await self._completed()
            return Stream(self._events(self._final(data, outcome)), media_type="text/event-stream", headers=self.response_headers(outcome.rounds))
        loop = self.rounds(await self.page())
        step = await self.advance(loop, None)
        while isinstance(step, CallWorker):
            round_ = StreamedRound(self, step)
            first = await round_.until_committed()
            if first is not None and not round_.client_tool_calls():
                return Stream(self._relay(round_, first, loop), media_type="text/event-stream", headers=self.response_headers(step.round + 1))
            step = await self.advance(loop, round_.reply(delivered=False))
        # A call of the client's own tools goes back as the upstream sent it.
        body = round_.replay() if step.kind == "client_tool_calls" else self._relay(round_, step.text, None)
        return Stream(body, media_type="text/event-stream", headers=self.response_headers(step.rounds))

    async def _events(self, data: dict[str, Any]) -> AsyncIterator[bytes]:
        """A whole completion as the stream of chunks that would have carried it."""
        meta = {"id": data.get("id", ""), "object": "chat.completion.chunk", "created": data.get("created", int(time.time())), "model": data.get("model", "")}
        for n, choice in enumerate(data["choices"]):
            message = choice["message"]
            delta = {"role": "assistant", "content": message.get("content")}
            if message.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            for part, finish in ((delta, None), ({}, choice.get("finish_reason") or "stop")):
                yield _event({**meta, "choices": [{"index": choice.get("index", n), "delta": part, "finish_reason": finish}]})
        if (self.body.get("stream_options") or {}).get("include_usage"):
            yield _event({**meta, "choices": [], "usage": data["usage"]})
        yield b"data: [DONE]\n\n"

    async def _relay(self, round_: StreamedRound, first: str, loop: Rounds | None) -> AsyncIterator[bytes]:
        """The answer as SSE: ``first``, then (with ``loop``) the rest of the round as it comes."""
        released = bool(first)
        yield round_.chunk({"role": "assistant", "content": ""})
        if first:
            yield round_.chunk({"content": first})
        if loop is not None:
            try:
                async for text in round_.rest():
                    released = released or bool(text.strip())
                    yield round_.chunk({"content": text})
            except ProxyError as error:
                yield b"data: " + error.envelope() + b"\n\n"
                return
        if not released:
            yield round_.chunk({"content": NO_ANSWER})
        yield round_.chunk({}, finish_reason="stop")
        if (self.body.get("stream_options") or {}).get("include_usage"):
            yield round_.event({"choices": [], "usage": msgspec.to_builtins(self.usage)})
        yield b"data: [DONE]\n\n"
        if loop is not None:
            await self.advance(loop, round_.reply(delivered=True))


class StreamedRound:
    """One streamed worker call, read through an AnswerGate."""

    def __init__(self, request: ProtocolRequest, call: CallWorker):
        self.request = request
        self.call = call
        self.gate = AnswerGate(final=call.final)
        self.events: list[dict[str, Any]] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.meta = {"id": f"chatcmpl-pcp{short_hash(str(time.time_ns()))}", "model": request.body.get("model", ""), "created": int(time.time())}
        self._iterator: AsyncIterator[str] = self._texts()

    async def _open(self) -> AsyncIterator[dict[str, Any]]:
        upstream = self.request.services.upstream
        response = await self.request.open_worker(self.call)
        if response.status_code >= 400:
            raise ProxyError.from_upstream(response.status_code, await upstream.read(response), response.headers.get("content-type"))
        return upstream.sse_events(response)

    async def _texts(self) -> AsyncIterator[str]:
        """Releasable text as the upstream generates it; ends when the round does."""
        async for event in await self._open():
            self.events.append(event)
            self.request.usage.add(event.get("usage"))
            self.meta.update({k: event[k] for k in ("id", "model", "created") if k in event})
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                self._collect_tool_calls(delta.get("tool_calls") or ())
                if delta.get("content"):
                    yield self.gate.feed(delta["content"])
        yield self.gate.close()

    async def until_committed(self) -> str | None:
        """The first text released, once the round commits to answering; None if it never does."""
        async for text in self._iterator:
            if self.gate.committed and (text or self.call.final):
                return text
        return "" if self.gate.committed and not self.gate.saw_directive else None

    async def rest(self) -> AsyncIterator[str]:
        async for text in self._iterator:
            if text:
                yield text

    def _collect_tool_calls(self, deltas: Any) -> None:
        for delta in deltas:
            call = self.tool_calls.setdefault(delta.get("index", 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] = delta.get("id") or call["id"]
            function = delta.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def client_tool_calls(self) -> bool:
        return calls_client_tool(list(self.tool_calls.values()), self.request.client_tools)

    def reply(self, delivered: bool) -> WorkerReply:
        return WorkerReply(text=self.gate.raw_text, tool_calls=list(self.tool_calls.values()), delivered=delivered)

    async def replay(self) -> AsyncIterator[bytes]:
        for event in self.events:
            yield self.event(event)
        yield b"data: [DONE]\n\n"

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return self.event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

    def event(self, payload: dict[str, Any]) -> bytes:
        return _event({**self.meta, "object": "chat.completion.chunk", **payload})


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _spoken(choice: dict[str, Any]) -> str:
    """What one more choice of the answering round says, its directives taken out."""
    return parse_directives(choice["message"].get("content") or "")[0].strip() or NO_ANSWER


def _answer(choice: dict[str, Any], index: int, text: str) -> dict[str, Any]:
    finish = choice.get("finish_reason")
    return {**choice, "index": index, "message": {"role": "assistant", "content": text}, "finish_reason": "stop" if finish in (None, "tool_calls") else finish}


def _hold(session: Session, link: str, query: Turn, block: PBlock) -> None:
    """The session takes the query, a File block, as its next message, scanned.

    The follow-up sends that message back as history: it finds the block
    there and does not scan it again, and keeps what this answer read
    (solidified), even when the file was the conversation's first message.
    """
    session.chain = [*session.chain, link]
    session.seen_at = [*session.seen_at, query.timestamp]
    session.pages = msgspec.structs.replace(session.pages, blocks=[*session.pages.blocks, block])


@lru_cache(maxsize=4)
def paging_policy(block_tokens: int) -> PagingPolicy:
    """How histories are paged; ``block_tokens`` 0 pages every message as turns."""
    return PagingPolicy(blocks=Scan(block_tokens=block_tokens or sys.maxsize))


def pinned_session(headers: Mapping[str, str]) -> str | None:
    """The session the client names in ``x-pcp-session``, if it names one."""
    pinned = headers.get("x-pcp-session")
    if pinned is not None and not SESSION_ID.match(pinned):
        raise ProxyError(400, "x-pcp-session must be 1 to 128 letters, digits or . _ : -", "invalid_request_error", param="x-pcp-session", code="invalid_session")
    return pinned


async def run_protocol(services: Services, body: dict[str, Any], headers: dict[str, str], namespace: str, measured: Measured, pinned: str | None = None) -> Response[Any]:
    request = ProtocolRequest(services, body, headers, namespace, measured, pinned)
    # Encoding history texts in the background would take the interpreter from this request.
    with services.embedder.serving() if services.embedder is not None else nullcontext():
        return await (request.stream() if body.get("stream") else request.complete())
