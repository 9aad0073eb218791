"""HTTP routes. Thin: parse, measure, hand over, relay."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import httpx
import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream

from pcp_core.pages import short_hash

from .chat import ChatRequest, parse_chat_request
from .errors import ProxyError
from .host import measure, pinned_session, run_protocol
from .upstream import forwardable

if TYPE_CHECKING:
    from .app import Services

__all__ = ["ROUTES"]

T = TypeVar("T")

CLIENT_CLOSED = 499  # never delivered: the client is gone; it only marks the access log


def _services(request: Request[Any, Any, Any]) -> Services:
    return request.app.state.services


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    services = _services(request)
    headers = services.upstream_headers(request.headers)
    body = await request.body()
    chat = parse_chat_request(body)
    namespace = short_hash(request.headers.get("authorization", "anonymous"))
    measured = measure(services, chat.messages, namespace)
    tokens = measured.tokens
    if services.sentry.engaged(tokens) and chat.messages:
        services.metrics.inc("pcp_requests_total", mode="protocol")
        work = run_protocol(services, _whole_body(body, chat), headers, namespace, measured, pinned_session(request.headers))
        # Worker rounds run before any byte is sent: a client that leaves cancels them.
        response = await _unless_client_leaves(request, work)
        response.headers["x-pcp-prompt-tokens"] = str(tokens)
        return response
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    pcp_headers = {"x-pcp-mode": "passthrough", "x-pcp-prompt-tokens": str(tokens)}
    return await _forward(services, request, "POST", "/chat/completions", body, headers, pcp_headers, stream=chat.stream)


def _whole_body(body: bytes, chat: ChatRequest) -> dict[str, Any]:
    """Every field of the request, the messages already decoded once reused."""
    fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])  # values stay undecoded bytes
    return {key: chat.messages if key == "messages" else msgspec.json.decode(raw) for key, raw in fields.items()}


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[Any]:
    services = _services(request)
    headers = services.upstream_headers(request.headers)
    return await _forward(services, request, "GET", "/models", None, headers, {"x-pcp-mode": "passthrough"})


@get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request[Any, Any, Any]) -> Response[Any]:
    services = _services(request)
    headers = services.upstream_headers(request.headers)
    return await _forward(services, request, "GET", f"/models/{_model_path(request.path_params['model_id'])}", None, headers, {"x-pcp-mode": "passthrough"})


def _model_path(model_id: str) -> str:
    """A model id ("gpt-4o", "org/model") as a path under /models, each segment quoted.

    The id arrives decoded: "%2e%2e" is "..". Forwarded as it is, it would
    climb out of /models to any upstream path, with the proxy's upstream key.
    """
    segments = model_id.strip("/").split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        raise ProxyError.bad_request(f"invalid model id {model_id.strip('/')!r}", param="model")
    return "/".join(quote(segment, safe=":@") for segment in segments)


@get("/healthz")
async def healthz(request: Request[Any, Any, Any]) -> dict[str, str]:
    return {"status": "ok", "upstream": _services(request).upstream.shown_url}


async def _forward(
    services: Services,
    request: Request[Any, Any, Any],
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    pcp_headers: dict[str, str],
    *,
    stream: bool = False,
) -> Response[Any]:
    upstream = services.upstream
    if stream:
        response = await upstream.open(method, path, content=body, headers=headers)
        # Litestar cancels the relay when the client disconnects; the relay's
        # finally then closes the upstream stream, which cancels the generation.
        return Stream(upstream.relay(response), **_relayed(response, pcp_headers))

    async def exchange() -> tuple[httpx.Response, bytes]:
        response = await upstream.open(method, path, content=body, headers=headers)
        return response, await upstream.read(response)

    response, content = await _unless_client_leaves(request, exchange())
    return Response(content, **_relayed(response, pcp_headers))


def _relayed(response: httpx.Response, pcp_headers: dict[str, str]) -> dict[str, Any]:
    headers = forwardable(response.headers)
    media_type = headers.pop("content-type", None) or headers.pop("Content-Type", None)
    headers.update(pcp_headers)
    return {"status_code": response.status_code, "headers": headers, "media_type": media_type}


async def _unless_client_leaves(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client disconnects first."""
    handler = asyncio.current_task()
    assert handler is not None
    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(lambda w: w.cancelled() or handler.cancel())
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            raise ProxyError(CLIENT_CLOSED, "client closed the connection", "client_closed") from None
        raise
    finally:
        watcher.cancel()


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> str:
    return _services(request).metrics.exposition()


ROUTES = [chat_completions, list_models, retrieve_model, healthz, metrics]
