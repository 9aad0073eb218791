"""HTTP routes. Thin: parse, measure, hand over, relay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import msgspec
from litestar import Request, Response, get, post

from pcp_core import SESSION_ID, Conversation, engaged, prompt_tokens, short_hash

from .chat import ChatRequest, parse_chat_request
from .drive import serve_protocol
from .errors import ClientError
from .forward import forward, unless_client_leaves
from .memory.hooks import MEMORY_HEADER, faults, memory_scope, remember_forwarded

if TYPE_CHECKING:
    from .app import Services

__all__ = ["ROUTES", "caller_namespace"]


def _services(request: Request[Any, Any, Any]) -> Services:
    return request.app.state.services


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    services = _services(request)
    headers = services.upstream_headers(request.headers)
    body = await request.body()
    chat = parse_chat_request(body)
    namespace = caller_namespace(request.headers)
    scope = memory_scope(services, request.headers, body, namespace)
    headers.pop(MEMORY_HEADER, None)  # ours, not the upstream's
    count = services.tokenizer.count
    tokens = prompt_tokens(chat.messages, count)
    # A scope whose memory holds pages is a page fault: protocol mode, whatever the size.
    if (engaged(tokens, services.policy) or faults(services, scope)) and chat.messages:
        services.metrics.inc("pcp_requests_total", mode="protocol")
        conversation = Conversation.of(chat.messages, services.policy.paging.blocks, count)
        work = serve_protocol(services, _whole_body(body, chat), conversation, headers, namespace, pinned_session(request.headers), memory=scope)
        # Worker rounds run before any byte is sent: a client that leaves cancels them.
        response = await unless_client_leaves(request, work)
        response.headers["x-pcp-prompt-tokens"] = str(tokens)
        if scope is not None:
            response.headers[MEMORY_HEADER] = scope.name
        return response
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    pcp_headers = {"x-pcp-mode": "passthrough", "x-pcp-prompt-tokens": str(tokens), **({MEMORY_HEADER: scope.name} if scope else {})}
    response = await forward(services.upstream, request, "POST", "/chat/completions", body, headers, pcp_headers, stream=chat.stream)
    remember_forwarded(services, scope, namespace, chat.messages, response.status_code, pinned_session(request.headers))
    return response


def caller_namespace(headers: Mapping[str, str]) -> str:
    """The caller's namespace: a hash of its key. Sessions and memory of one key never meet another's."""
    return short_hash(headers.get("authorization", "anonymous"))


def pinned_session(headers: Mapping[str, str]) -> str | None:
    """The session the client names in ``x-pcp-session``, if it names one."""
    pinned = headers.get("x-pcp-session")
    if pinned is not None and not SESSION_ID.match(pinned):
        raise ClientError("x-pcp-session must be 1 to 128 letters, digits or . _ : -", param="x-pcp-session", code="invalid_session")
    return pinned


def _whole_body(body: bytes, chat: ChatRequest) -> dict[str, Any]:
    """Every field of the request, the messages already decoded once reused."""
    fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])  # values stay undecoded bytes
    return {key: chat.messages if key == "messages" else msgspec.json.decode(raw) for key, raw in fields.items()}


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[Any]:
    services = _services(request)
    headers = services.upstream_headers(request.headers)
    return await forward(services.upstream, request, "GET", "/models", None, headers, {"x-pcp-mode": "passthrough"})


@get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request[Any, Any, Any]) -> Response[Any]:
    services = _services(request)
    headers = services.upstream_headers(request.headers)
    return await forward(services.upstream, request, "GET", f"/models/{_model_path(request.path_params['model_id'])}", None, headers, {"x-pcp-mode": "passthrough"})


def _model_path(model_id: str) -> str:
    """A model id ("gpt-4o", "org/model") as a path under /models, each segment quoted.

    The id arrives decoded: "%2e%2e" is "..". Forwarded as it is, it would
    climb out of /models to any upstream path, with the proxy's upstream key.
    """
    segments = model_id.strip("/").split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        raise ClientError(f"invalid model id {model_id.strip('/')!r}", param="model")
    return "/".join(quote(segment, safe=":@") for segment in segments)


@get("/healthz")
async def healthz(request: Request[Any, Any, Any]) -> dict[str, str]:
    return {"status": "ok", "upstream": _services(request).upstream.shown_url}


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> str:
    return _services(request).metrics.exposition()


ROUTES = [chat_completions, list_models, retrieve_model, healthz, metrics]
