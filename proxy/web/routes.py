"""The routes of the APIs the proxy serves. Thin: read, measure, hand over, relay.

A request of a paged API (``apis``: chat completions, Responses, Messages) is
read by its API, counted, and either paged (``protocol.drive``) or forwarded as
it came (``forward``). Every other ``/v1`` path is forwarded. The proxy key is
checked by the routers' guard (``keys.proxy_key``) before any handler runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any, TypeVar

import msgspec
from litestar import HttpMethod, Request, Response, get, route
from litestar.di import NamedDependency

from pcp_core import Conversation, asks_to_compact, client_named, engaged, pageable, prompt_tokens, within_window
from pcp_core.conversation import conversation_start, query_shown

from .. import headers as pcp
from ..apis.chat import CHAT
from ..apis.codec import Api, Codec, Reading, tools_text, whole_body
from ..apis.messages import MESSAGES, MessagesCodec
from ..apis.responses import RESPONSES
from ..errors import ClientError, PcpError
from ..memory.hooks import faults, memory_scope, remember_forwarded
from ..memory.scopes import Scope
from ..protocol.control import Control
from ..protocol.drive import serve_protocol
from ..protocol.refusals import TooLong, refused_window
from ..protocol.telemetry import RequestTelemetry
from ..services import Services
from .agent_compaction import COMPACTING, MARKED, answered, marked_behind
from .context_management import COMPACT_PATH, Plan, compacted, plan, responses_plan, serves_context_management
from .forward import forward, relayed, unless_client_leaves, upstream_target
from .handlers import not_the_proxys, speaks_anthropic
from .keys import check_metrics_key, shows_details, upstream_headers

__all__ = ["API_ROUTES", "OPEN_ROUTES", "RESERVED"]

T = TypeVar("T")

log = logging.getLogger("pcp.proxy")

# A body over this is read (decoded, counted, its conversation found) in a thread: at a million
# tokens that is time of the event loop's that the requests it serves meanwhile would wait for (bench/mixed_load.py).
LARGE_BODY = 256 * 1024
# Every method a /v1 path may be called with; what the proxy does not page is forwarded.
METHODS = [HttpMethod.GET, HttpMethod.HEAD, HttpMethod.POST, HttpMethod.PUT, HttpMethod.PATCH, HttpMethod.DELETE]
PASSTHROUGH = {pcp.MODE: "passthrough"}


@route("/chat/completions", http_method=METHODS, status_code=200)
async def chat_completions(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    if request.method != "POST":  # stored completions (list, retrieve, update, delete) are not paged
        return await forwarded(request, services)
    return await paged_api(request, services, CHAT)


@route("/responses", http_method=METHODS, status_code=200)
async def responses(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """OpenAI's Responses API: paged as chat is, in its stateless form (``apis.responses``)."""
    if request.method != "POST":  # a stored response (retrieve, delete, cancel, its input items) is not paged
        return await forwarded(request, services)
    return await paged_api(request, services, RESPONSES)


@route("/responses/compact", http_method=[HttpMethod.POST], status_code=200)
async def responses_compact(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """OpenAI's compaction (``POST /responses/compact``): the upstream's own where it has it, else the proxy's, whose
    compaction item is a handle to the history's pages (``context_management.compacted``)."""
    upstream, settings = services.upstream, services.settings
    translation = services.translation_of(RESPONSES)
    path = _asked_at(dataclasses.replace(RESPONSES, path=COMPACT_PATH), request).path
    body = await request.body()
    headers = upstream_headers(settings, request.headers, anthropic=False)
    if not (settings.serve_compact or translation.mode == "always" or COMPACT_PATH in translation.lacking):
        answer = await upstream.open("POST", path, content=body, headers=headers)
        try:
            content = await answer.aread()
        finally:
            await answer.aclose()
        if translation.mode == "never" or answer.status_code not in (404, 405):
            services.metrics.inc("pcp_requests_total", mode="passthrough")
            return Response(content, **relayed(answer, PASSTHROUGH))
        translation.lacking.add(COMPACT_PATH)
        log.info("the upstream answered POST %s with %s: the proxy compacts from now on", COMPACT_PATH, answer.status_code)
    namespace = services.namespaces.of(request.headers)
    compaction, session = await compacted(services, namespace, headers, body)
    services.metrics.inc("pcp_requests_total", mode="protocol")
    return Response(compaction, headers={pcp.MODE: "protocol", pcp.SESSION: session})


@route("/messages", http_method=METHODS, status_code=200)
async def messages(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """Anthropic's Messages API: paged as chat is (``apis.messages``)."""
    if request.method != "POST":
        return await forwarded(request, services)
    return await paged_api(request, services, MESSAGES)


async def paged_api(request: Request[Any, Any, Any], services: Services, api: Api, again: bool = False) -> Response[Any]:
    """A request of ``api``: paged above the Sentry's threshold, else (or when it leans on state
    the proxy cannot see) forwarded as it came. Forwarded and refused as longer than its model's window, it is
    served ``again`` within the window the refusal named (``protocol.refusals``)."""
    started = perf_counter()
    headers = upstream_headers(services.settings, request.headers, anthropic=api is MESSAGES)
    api = _asked_at(api, request)
    body = await request.body()
    managed, behind = None, None
    if api.name == "messages" and serves_context_management(services):  # its context management, applied here
        namespace = services.namespaces.of(request.headers)
        managed = await _read(body, lambda: plan(services, namespace, body, lambda said: _api_read(api, said, services)))
        behind = managed.behind if managed is not None else None
    elif api.name == "responses":  # compaction items the proxy made: their pages behind the request
        namespace = services.namespaces.of(request.headers)
        opened = await _read(body, lambda: responses_plan(services, namespace, body))
        if opened is not None:
            body, behind = opened
    if not behind and MARKED in body:  # the markers of compactions answered here: their pages behind the request
        behind = marked_behind(services, services.namespaces.of(request.headers), body) or None
    if managed is not None:
        body, (reading, said, tokens, carried) = managed.body, managed.read
    else:
        reading, said, tokens, carried = await _read(body, lambda: _api_read(api, body, services))
    pcp_headers = dict(PASSTHROUGH)
    scope = None
    if reading.untouched is None:
        scope = _scope(services, request, body)
        pcp_headers[pcp.PROMPT_TOKENS] = str(tokens)
        if reading.messages and any(prompt in body for prompt in COMPACTING):
            compaction = await _agent_compaction(request, services, api, body, reading, headers)
            if compaction is not None:
                return compaction
        control = _paged(services, headers, reading.model, (tokens, carried), scope, managed, bool(behind) or again) if reading.messages else None
        if control is not None:
            asked = control
            codec, conversation = await _read(body, lambda: _codec(api, body, reading, asked, services))
            count = services.tokenizer.count
            if (managed is not None or behind) and not pageable(conversation, control.policy, count):
                most = managed.budget if managed is not None and managed.budget else tokens - carried
                control = _widened(control, conversation, services, most, carried)
            if pageable(conversation, control.policy, count):
                if managed is not None and isinstance(codec, MessagesCodec):
                    codec.managed = managed.managed
                counted = (_as_read(said, reading, conversation), tokens)
                return await _protocol(request, services, codec, conversation, counted, headers, control, scope, behind)
            _unpageable(control, tokens)  # else forwarded untouched: the model's window may hold it
    if managed is not None:  # not paged: as its edits leave it
        body = managed.forwarded
    rewrite = None
    if api.chat_body:
        body, rewrite = await _chat_extras(request, services, reading, body, pcp_headers, scope)
    off = request.headers.get(pcp.MODE_REQUEST, "").strip().lower() == "off"
    learns = reading.messages and reading.model is not None and not again and not off
    try:
        response = await forward(
            services.upstream_of(api),
            request,
            "POST",
            api.path,
            body,
            headers,
            pcp_headers,
            stream=reading.stream,
            failure=api.failure,
            rewrite=rewrite,
            as_stream=api.as_stream,
            too_long=refused_window if learns else None,
        )
    except TooLong as refused:
        assert reading.model is not None
        window = refused.refusal.in_our_count(tokens)
        services.controls.learn(reading.model, window)
        log.info("the upstream refused %d prompt tokens as longer than %s's window: %d tokens from now on", tokens, reading.model, window)
        return await paged_api(request, services, api, again=True)
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    if api.chat_body and scope is not None:  # memory: what a forwarded request said, written back in the background
        assert response.status_code is not None  # forward's responses carry the upstream's status (None is Litestar's "the route's default")
        remember_forwarded(
            services.memory, scope, services.namespaces.of(request.headers), reading.messages, response.status_code, pcp.pinned_session(request.headers)
        )
    services.metrics.observe("pcp_request_seconds", perf_counter() - started, mode="passthrough")
    return response


async def _agent_compaction(
    request: Request[Any, Any, Any], services: Services, api: Api, body: bytes, reading: Reading, headers: dict[str, str]
) -> Response[Any] | None:
    """An agent's compaction of its history, answered from the pages (``agent_compaction``); None: the request is not
    one, or turns protocol mode off."""
    control = services.controls.of(dict(headers), reading.model)  # a copy: the control headers stay for ``_paged``
    if control.mode == "off":
        return None
    codec, conversation = await _read(body, lambda: _codec(api, body, reading, control, services))
    if not asks_to_compact(conversation):
        return None
    namespace = services.namespaces.of(request.headers)
    return await answered(services, api, codec, conversation, json.loads(body), headers, namespace, control.policy)


def _asked_at(api: Api, request: Request[Any, Any, Any]) -> Api:
    """``api`` at the path the client asked for: with its query string (Anthropic's SDK adds ``?beta=true``,
    Azure's ``?api-version=…``), which every upstream call made for the request carries, in both modes."""
    query = request.scope.get("query_string") or b""
    return dataclasses.replace(api, path=f"{api.path}?{query.decode('latin-1')}") if query else api


async def _chat_extras(
    request: Request[Any, Any, Any], services: Services, reading: Reading, body: bytes, pcp_headers: dict[str, str], scope: Scope | None
) -> tuple[bytes, Any]:
    """A chat body below the threshold: the session's PACT components in place, Hybrid mode's snapshot in
    (and the rewrite that takes the model's out of the answer); as it came when neither applies."""
    if scope is not None:
        pcp_headers[pcp.MEMORY] = scope.name
    body = await services.components.passthrough(request.headers, services.namespaces, reading, body, pcp_headers)
    context = services.hybrid.begin(request.headers, lambda: services.namespaces.of(request.headers), scope.key if scope is not None else None)
    if context is not None:
        body = await context.passthrough(reading, body, pcp_headers)
    return body, context


async def _read(body: bytes, read: Callable[[], T]) -> T:
    """``read()``: in a thread when ``body`` is over ``LARGE_BODY``, so the requests the event loop serves meanwhile do not wait for it."""
    return await asyncio.to_thread(read) if len(body) > LARGE_BODY else read()


def _api_read(api: Api, body: bytes, services: Services) -> tuple[Reading, int, int, int]:
    """The request as ``api`` reads it, its messages' tokens, its prompt's (theirs and its tool
    definitions'), and its head's, which a worker call carries whole (``head_tokens``): 0 for one forwarded
    untouched, which is not counted. A chat body that resends the messages of one read before decodes
    and counts only those it adds (``apis.known_bodies``)."""
    count = services.tokenizer.count
    if api.read is CHAT.read:
        reading, said = services.bodies.read(body, count)
    else:
        reading = api.read(body)
        if reading.untouched is not None:
            return reading, 0, 0, 0
        said = prompt_tokens(reading.messages, count)
    tools = tools_text(body if reading.rest is None else reading.rest)
    tools_tokens = count(tools) if tools else 0
    head = reading.messages[: conversation_start(reading.messages)]  # the leading system and developer messages
    return reading, said, said + tools_tokens, (prompt_tokens(head, count) if head else 0) + tools_tokens


def _as_read(said: int, reading: Reading, conversation: Conversation) -> int:
    """``said``, the tokens of the request's messages, when they are the conversation's (0: some were merged
    into one turn, a chat exchange's calls and results: their sum is not the conversation's)."""
    same = len(reading.messages) == len(conversation.head) + len(conversation.history) + (conversation.query is not None)
    return said if same else 0


def _scope(services: Services, request: Request[Any, Any, Any], body: bytes) -> Scope | None:
    """The request's memory scope (``x-pcp-memory``, or its ``user``); None: no memory. (Like every
    ``x-pcp-*`` header it never goes upstream: ``proxy.upstream.outgoing``.)"""
    namespace = lambda: services.namespaces.of(request.headers)  # noqa: E731
    return memory_scope(services.memory, request.headers, body, namespace, services.settings.memory_scope_from_user)


def _paged(
    services: Services,
    headers: dict[str, str],
    model: str | None,
    counted: tuple[int, int],
    scope: Scope | None,
    managed: Plan | None = None,
    paged: bool = False,
) -> Control | None:
    """The request's mode and policy when it goes out in protocol mode, else None: its model's
    (``[models."…"]``), narrowed by its x-pcp-* headers and fitted to its window; a scope whose memory holds
    pages is a page fault, whatever the request's size; context management the proxy applies pages it
    (``context_management``), and so does ``paged`` (a compaction's pages behind it, or a refusal of it
    untouched), unless the request turns protocol mode off. ``counted``: its prompt's tokens, and its head's."""
    control = services.controls.of(headers, model)
    tokens, carried = counted
    if control.policy.window:
        control = msgspec.structs.replace(control, policy=within_window(control.policy, carried))
    if managed is not None and managed.forced and control.mode != "off":
        return managed.controlled(control)
    if paged and control.mode != "off":
        return msgspec.structs.replace(control, mode="force")
    paged = control.mode == "force" or (control.mode == "auto" and (engaged(tokens, control.policy, carried) or faults(services.memory, scope)))
    return control if paged else None


def _codec(api: Api, body: bytes, reading: Reading, control: Control, services: Services) -> tuple[Codec, Conversation]:
    """The request's codec, and its conversation as the rules read it."""
    # Its fields but the messages (decoded already) from what is left of it once the messages read before are known.
    codec = api.codec(whole_body(body if reading.rest is None else reading.rest, api.read_fields, reading.decoded))
    codec.api = api  # at the path the client asked for (``_asked_at``)
    return codec, Conversation.of(reading.messages, control.policy.paging.blocks, services.tokenizer.count, query_shown(control.policy.rounds.budget))


def _widened(control: Control, conversation: Conversation, services: Services, most: int, carried: int) -> Control:
    """Context management the proxy applies, in a budget the query and its attachments alone fill: the budget doubled
    until the request pages, up to ``most`` (what the request its edits leave takes beside its head) and what the
    model's window leaves beside the ``carried`` head; else ``control`` as it was. Its edits are then paged, not
    applied by dropping what they clear."""
    budget, rounds = control.policy.rounds.budget, control.policy.rounds
    window = control.policy.window
    most = min(most, max(window - carried, 0)) if window else most
    while budget < most:
        budget = min(budget * 2, most)
        policy = msgspec.structs.replace(control.policy, rounds=msgspec.structs.replace(rounds, budget=budget))
        if pageable(conversation, policy, services.tokenizer.count):
            return msgspec.structs.replace(control, policy=policy)
    return control


def _unpageable(control: Control, tokens: int) -> None:
    """A request whose query and attachments alone leave its budget no room for pages: refused where the model's
    window is known to be too small for it as it is; else (the caller) it goes untouched."""
    window = control.policy.window
    if window and tokens > window:
        raise ClientError(
            f"this request cannot be paged: its query and attachments alone fill the context budget ({control.policy.rounds.budget:,} "
            f"tokens), and at {tokens:,} tokens it is larger than the model's context window ({window:,}): raise PCP_CONTEXT_BUDGET",
            status=413,
            code="context_budget_too_small",
        )
    log.info("a request's query and attachments fill the context budget (%d tokens): forwarded untouched", control.policy.rounds.budget)


async def _protocol(
    request: Request[Any, Any, Any],
    services: Services,
    codec: Codec,
    conversation: Conversation,
    counted: tuple[int, int],
    headers: dict[str, str],
    control: Control,
    scope: Scope | None,
    behind: list[str] | None = None,
) -> Response[Any]:
    """``counted``: the tokens of the request's messages, and of its whole prompt (with its tools); ``behind``: sessions
    whose pages it reads beside its own (a compaction's, ``context_management``)."""
    said, tokens = counted
    namespace = services.namespaces.of(request.headers)
    messages = [*conversation.head, *conversation.history, *([conversation.query] if conversation.query is not None else [])]
    telemetry = RequestTelemetry(services.traces, services.metrics, namespace, codec.model, tokens, control, len(messages), said)
    work = serve_protocol(
        services,
        codec,
        conversation,
        headers,
        namespace,
        _pinned(request, conversation),
        policy=control.policy,
        telemetry=telemetry,
        memory=scope,
        behind=behind,
    )
    told = {pcp.PROMPT_TOKENS: str(tokens), **({pcp.MEMORY: scope.name} if scope is not None else {})}
    try:  # worker rounds run before any byte is sent: a client that leaves cancels them
        response = await unless_client_leaves(request, work)
    except PcpError as error:  # not a served request: not counted as one, and the client still learns the mode
        services.metrics.inc("pcp_requests_failed_total", mode="protocol", status=str(error.status))
        error.headers.update({pcp.MODE: "protocol", **told})
        raise
    services.metrics.inc("pcp_requests_total", mode="protocol")
    response.headers.update(told)
    return response


def _pinned(request: Request[Any, Any, Any], conversation: Conversation) -> str | None:
    """The session the client pins (``x-pcp-session``); else, for a coding agent that names its own session,
    the one that agent session and conversation keep (``pcp_core.client_named``); else None: found by content."""
    named, said = pcp.client_session(request.headers), [*conversation.history, conversation.query]
    return pcp.pinned_session(request.headers) or (client_named(named, said[0]) if named else None)


@route("/messages/count_tokens", http_method=METHODS, status_code=200)
async def count_tokens(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """Anthropic's token count, of what the proxy would send. A request it would page counts what one worker call
    carries at most (the head whole and the budget): a coding agent that measures its context by it is not pushed
    into compacting what the proxy pages. One it would forward is counted by the upstream, or by the proxy
    (tiktoken) where the upstream has no count of its own (a chat-only upstream)."""
    if request.method != "POST":
        return await forwarded(request, services)
    headers = upstream_headers(services.settings, request.headers, anthropic=True)
    body = await request.body()
    reading, _, tokens, carried = await _read(body, lambda: _api_read(MESSAGES, body, services))
    control = _paged(services, headers, reading.model, (tokens, carried), None) if reading.messages else None
    if control is not None:
        return _count(min(tokens, carried + control.policy.rounds.budget), "protocol")
    upstream = services.upstream_of(MESSAGES)
    translation = services.translation_of(MESSAGES)
    if translation.mode != "always" and "/messages" not in translation.lacking:
        target = upstream_target(request.scope)
        response = await forward(upstream, request, "POST", target, body, headers, PASSTHROUGH, stream=False, failure=MESSAGES.failure)
        if response.status_code not in (404, 405):
            return response
    return _count(tokens, "passthrough")


def _count(tokens: int, mode: str) -> Response[Any]:
    return Response({"input_tokens": tokens}, status_code=200, headers={pcp.MODE: mode, pcp.PROMPT_TOKENS: str(tokens)})


@route("/{path:path}", http_method=METHODS, status_code=200)
async def forward_v1(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    return await forwarded(request, services)


async def forwarded(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """Any /v1 call the proxy does not page, forwarded as it came: the path, the query, the headers, the body
    (to Anthropic's upstream, when it has one, for a client of Anthropic's API)."""
    started = perf_counter()
    anthropic = speaks_anthropic(request)
    headers = upstream_headers(services.settings, request.headers, anthropic)
    target = upstream_target(request.scope)
    # A body only where the client sent one (an empty POST says so with its content-length: 0).
    sent = "content-length" in request.headers or "transfer-encoding" in request.headers
    body = await request.body() if sent else None
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    api = MESSAGES if anthropic else CHAT
    response = await forward(services.upstream_of(api), request, request.method, target, body, headers, PASSTHROUGH, stream=None, failure=api.failure)
    services.metrics.observe("pcp_request_seconds", perf_counter() - started, mode="passthrough")
    return response


@route(["/", "/{path:path}"], http_method=METHODS)
async def reserved(request: Request[Any, Any, Any]) -> Response[Any]:
    """Reserved for the proxy's own API (sessions, memory): never forwarded."""
    raise not_the_proxys(request.url.path)


@get("/healthz")
async def healthz(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[dict[str, Any]]:
    """Liveness for anyone, and the embedded model's: ``busy`` while requests wait for its slots, a 503 once it is
    down; what the proxy fronts only for a proxy key, when it has keys."""
    local = await services.local_model.health() if services.local_model is not None else None
    status = "unavailable" if local is not None and local["status"] == "down" else local["status"] if local is not None else "ok"
    said: dict[str, Any] = {"status": status}
    if shows_details(services.settings, request.headers):
        said["upstream"] = services.upstream.shown_url
        said["apis"] = services.translation.fronts()  # native, or translated to chat completions, and why
        if local is not None:
            said["local_model"] = local
    return Response(said, status_code=503 if status == "unavailable" else 200)


@route("/", http_method=[HttpMethod.GET, HttpMethod.HEAD])
async def root() -> Response[bytes]:
    """The root: a client's connectivity probe (Claude Code's ``HEAD /``) finds a server that answers."""
    return Response(b'{"status": "ok"}', media_type="application/json")


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> str:
    check_metrics_key(services.settings, request.headers)
    return services.metrics.exposition()


API_ROUTES = [chat_completions, responses, responses_compact, messages, count_tokens, forward_v1]  # under /v1
RESERVED = reserved  # under /v1/pcp, beside the own API's routes
OPEN_ROUTES = [root, healthz, metrics]  # at the root, without a proxy key
