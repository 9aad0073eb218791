"""HTTP routes. Thin: parse, measure, hand over, relay."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar

from litestar import HttpMethod, Request, Response, get, route

from pcp_core import Conversation, CountText, engaged, prompt_tokens

from .. import headers as pcp
from ..apis.chat import ChatCodec, ChatRequest, parse_chat_request
from ..apis.codec import Api, Codec, Reading, whole_body
from ..apis.messages import MESSAGES
from ..apis.responses import RESPONSES
from ..errors import ClientError, anthropic_event
from ..memory.hooks import MEMORY_HEADER, faults, memory_scope, remember_forwarded
from ..memory.scopes import Scope
from ..protocol.control import Control
from ..protocol.drive import serve_protocol
from ..protocol.telemetry import RequestTelemetry
from ..sse import error_event
from .forward import forward, unless_client_leaves, upstream_target

if TYPE_CHECKING:
    from ..app import Services

__all__ = ["ROUTES"]

T = TypeVar("T")


def _services(request: Request[Any, Any, Any]) -> Services:
    return request.app.state.services


# A body over this is read (decoded, counted, its conversation found) in a thread: at a million
# tokens (~4.4 MB) that is ~20 ms of the event loop's that the requests it serves meanwhile would wait for.
LARGE_BODY = 256 * 1024
# Every method a /v1 path may be called with; what the proxy does not page is forwarded.
METHODS = [HttpMethod.GET, HttpMethod.HEAD, HttpMethod.POST, HttpMethod.PUT, HttpMethod.PATCH, HttpMethod.DELETE]
PASSTHROUGH = {pcp.MODE: "passthrough"}


@route("/v1/chat/completions", http_method=METHODS, status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    if request.method != "POST":  # stored completions (list, retrieve, update, delete) are not paged
        return await forwarded(request)
    started = perf_counter()
    services = _services(request)
    headers = services.upstream_headers(request.headers)
    body = await request.body()
    chat, tokens = await _read(body, lambda: _chat_read(body, services.tokenizer.count))
    scope = _scope(services, request, body)
    control = _paged(services, headers, chat.model, tokens, scope) if chat.messages else None
    if control is not None:
        codec = lambda: ChatCodec(whole_body(body, _CHAT_READS, {"messages": chat.messages}))  # noqa: E731
        return await _protocol(request, services, body, codec, chat.messages, tokens, headers, control, scope)
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    pcp_headers = {pcp.MODE: "passthrough", pcp.PROMPT_TOKENS: str(tokens), **({MEMORY_HEADER: scope.name} if scope else {})}
    # PACT components: the session's live ones in place; a request without any goes as it came.
    body = await services.components.passthrough(request.headers, services.namespaces, chat, body, pcp_headers)
    # Hybrid mode: the session's snapshot in, the model's out of the answer; None (nothing changes) unless it is on.
    context = services.hybrid.begin(request.headers, lambda: services.namespaces.of(request.headers), scope.key if scope is not None else None)
    if context is not None:
        body = await context.passthrough(chat, body, pcp_headers)
    response = await forward(services.upstream, request, "POST", "/chat/completions", body, headers, pcp_headers, stream=chat.stream, rewrite=context)
    if scope is not None:  # memory: what a forwarded request said, written back in the background
        remember_forwarded(services, scope, services.namespaces.of(request.headers), chat.messages, response.status_code, pcp.pinned_session(request.headers))
    services.metrics.observe("pcp_request_seconds", perf_counter() - started, mode="passthrough")
    return response


# The fields chat's protocol mode reads; every other one goes upstream as the bytes the client sent.
_CHAT_READS = frozenset({"stream", "model", "tools", "stream_options", "n", "pcp_components"})


@route("/v1/responses", http_method=METHODS, status_code=200)
async def responses(request: Request[Any, Any, Any]) -> Response[Any]:
    """OpenAI's Responses API: paged as chat is, in its stateless form (``responses``)."""
    if request.method != "POST":  # a stored response (retrieve, delete, cancel, its input items) is not paged
        return await forwarded(request)
    return await _api(request, RESPONSES)


@route("/v1/messages", http_method=METHODS, status_code=200)
async def messages(request: Request[Any, Any, Any]) -> Response[Any]:
    """Anthropic's Messages API: paged as chat is (``messages``)."""
    if request.method != "POST":
        return await forwarded(request)
    return await _api(request, MESSAGES)


async def _api(request: Request[Any, Any, Any], api: Api) -> Response[Any]:
    """A request of ``api``: paged above the Sentry's threshold, else (or when it leans on state
    the proxy cannot see) forwarded as it came."""
    started = perf_counter()
    services = _services(request)
    headers = services.upstream_headers(request.headers, anthropic=api.name == "messages")
    body = await request.body()
    reading, tokens = await _read(body, lambda: _api_read(api, body, services.tokenizer.count))
    upstream = services.upstream_of(api.name)
    pcp_headers = dict(PASSTHROUGH)
    if reading.untouched is None:
        scope = _scope(services, request, body)
        pcp_headers[pcp.PROMPT_TOKENS] = str(tokens)
        control = _paged(services, headers, reading.model, tokens, scope) if reading.messages else None
        if control is not None:
            codec = lambda: api.codec(whole_body(body, api.read_fields, reading.decoded))  # noqa: E731
            return await _protocol(request, services, body, codec, reading.messages, tokens, headers, control, scope)
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    response = await forward(upstream, request, "POST", api.path, body, headers, pcp_headers, stream=reading.stream, failure=api.failure)
    services.metrics.observe("pcp_request_seconds", perf_counter() - started, mode="passthrough")
    return response


async def _read(body: bytes, read: Callable[[], T]) -> T:
    """``read()``: in a thread when ``body`` is over ``LARGE_BODY``, so the requests the event loop serves meanwhile do not wait for it."""
    return await asyncio.to_thread(read) if len(body) > LARGE_BODY else read()


def _chat_read(body: bytes, count: CountText) -> tuple[ChatRequest, int]:
    chat = parse_chat_request(body)
    return chat, prompt_tokens(chat.messages, count)


def _api_read(api: Api, body: bytes, count: CountText) -> tuple[Reading, int]:
    """The request as ``api`` reads it, and its prompt's tokens (0 for one forwarded untouched, which is not counted)."""
    reading = api.read(body)
    return reading, prompt_tokens(reading.messages, count) if reading.untouched is None else 0


def _scope(services: Services, request: Request[Any, Any, Any], body: bytes) -> Scope | None:
    """The request's memory scope (``x-pcp-memory``, or its ``user``); None: no memory. (Like every
    ``x-pcp-*`` header it never goes upstream: ``proxy.upstream.outgoing``.)"""
    return memory_scope(services, request.headers, body, lambda: services.namespaces.of(request.headers))


def _paged(services: Services, headers: dict[str, str], model: str | None, tokens: int, scope: Scope | None) -> Control | None:
    """The request's mode and policy when it goes out in protocol mode, else None: its model's
    (``[models."…"]``), narrowed by its x-pcp-* headers; a scope whose memory holds pages is a
    page fault, whatever the request's size."""
    control = services.controls.of(headers, model)
    paged = control.mode == "force" or (control.mode == "auto" and (engaged(tokens, control.policy) or faults(services, scope)))
    return control if paged else None


async def _protocol(request: Request[Any, Any, Any], services: Services, body: bytes, codec_of: Callable[[], Codec], messages: list[dict[str, Any]], tokens: int, headers: dict[str, str], control: Control, scope: Scope | None) -> Response[Any]:
    services.metrics.inc("pcp_requests_total", mode="protocol")
    namespace = services.namespaces.of(request.headers)
    codec, conversation = await _read(body, lambda: (codec_of(), Conversation.of(messages, control.policy.paging.blocks, services.tokenizer.count)))
    telemetry = RequestTelemetry(services.traces, services.metrics, namespace, codec.model, tokens, control, len(messages))
    work = serve_protocol(services, codec, conversation, headers, namespace, pcp.pinned_session(request.headers), policy=control.policy, telemetry=telemetry, memory=scope)
    # Worker rounds run before any byte is sent: a client that leaves cancels them.
    response = await unless_client_leaves(request, work)
    response.headers[pcp.PROMPT_TOKENS] = str(tokens)
    if scope is not None:
        response.headers[MEMORY_HEADER] = scope.name
    return response



def speaks_anthropic(request: Request[Any, Any, Any]) -> bool:
    """A client of Anthropic's API: its calls go to Anthropic's upstream, its errors are in Anthropic's envelope."""
    path = request.url.path
    return path == "/v1/messages" or path.startswith("/v1/messages/") or "anthropic-version" in request.headers


@route("/v1/{path:path}", http_method=METHODS, status_code=200)
async def forward_v1(request: Request[Any, Any, Any]) -> Response[Any]:
    return await forwarded(request)


async def forwarded(request: Request[Any, Any, Any]) -> Response[Any]:
    """Any /v1 call the proxy does not page, forwarded as it came: the path, the query, the headers, the body
    (to Anthropic's upstream, when it has one, for a client of Anthropic's API)."""
    started = perf_counter()
    services = _services(request)
    anthropic = speaks_anthropic(request)
    headers = services.upstream_headers(request.headers, anthropic)
    target = upstream_target(request.scope)
    # A body only where the client sent one (an empty POST says so with its content-length: 0).
    sent = "content-length" in request.headers or "transfer-encoding" in request.headers
    body = await request.body() if sent else None
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    upstream = services.upstream_of("messages" if anthropic else "chat")
    response = await forward(upstream, request, request.method, target, body, headers, PASSTHROUGH, stream=None, failure=anthropic_event if anthropic else error_event)
    services.metrics.observe("pcp_request_seconds", perf_counter() - started, mode="passthrough")
    return response


@route(["/v1/pcp", "/v1/pcp/{path:path}"], http_method=METHODS)
async def pcp_api(request: Request[Any, Any, Any]) -> Response[Any]:
    """Reserved for the proxy's own API (sessions, memory): never forwarded."""
    raise not_the_proxys(request.url.path)


def not_the_proxys(path: str) -> ClientError:
    """A path under /v1/pcp/ that names none of the proxy's own routes."""
    return ClientError(f"{path} is not a route of this proxy: /v1/pcp/ is reserved for its own API", status=404, type="not_found_error", code="unknown_url")


@get("/healthz")
async def healthz(request: Request[Any, Any, Any]) -> dict[str, str]:
    """Liveness for anyone; what the proxy fronts only for a proxy key, when it has keys."""
    services = _services(request)
    return {"status": "ok", "upstream": services.upstream.shown_url} if services.shows_details(request.headers) else {"status": "ok"}


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> str:
    services = _services(request)
    services.check_metrics_key(request.headers)
    return services.metrics.exposition()


ROUTES = [chat_completions, responses, messages, forward_v1, pcp_api, healthz, metrics]
