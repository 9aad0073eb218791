"""HTTP routes. Thin: parse, measure, hand over, relay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import msgspec
from litestar import Request, Response, get, post

from pcp_core import SESSION_ID, Conversation, engaged, prompt_tokens

from .chat import ChatRequest, decode_json, parse_chat_request
from .drive import serve_protocol
from .errors import ClientError
from .forward import forward, unless_client_leaves

if TYPE_CHECKING:
    from .app import Services

__all__ = ["ROUTES"]


def _services(request: Request[Any, Any, Any]) -> Services:
    return request.app.state.services


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    services = _services(request)
    headers = services.upstream_headers(request.headers)
    body = await request.body()
    chat = parse_chat_request(body)
    count = services.tokenizer.count
    tokens = prompt_tokens(chat.messages, count)
    if engaged(tokens, services.policy) and chat.messages:
        services.metrics.inc("pcp_requests_total", mode="protocol")
        conversation = Conversation.of(chat.messages, services.policy.paging.blocks, count)
        namespace = services.namespaces.of(request.headers)
        work = serve_protocol(services, _whole_body(body, chat), conversation, headers, namespace, pinned_session(request.headers))
        # Worker rounds run before any byte is sent: a client that leaves cancels them.
        response = await unless_client_leaves(request, work)
        response.headers["x-pcp-prompt-tokens"] = str(tokens)
        return response
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    pcp_headers = {"x-pcp-mode": "passthrough", "x-pcp-prompt-tokens": str(tokens)}
    return await forward(services.upstream, request, "POST", "/chat/completions", body, headers, pcp_headers, stream=chat.stream)


def pinned_session(headers: Mapping[str, str]) -> str | None:
    """The session the client names in ``x-pcp-session``, if it names one."""
    pinned = headers.get("x-pcp-session")
    if pinned is not None and not SESSION_ID.match(pinned):
        raise ClientError("x-pcp-session must be 1 to 128 letters, digits or . _ : -", param="x-pcp-session", code="invalid_session")
    return pinned


# The fields protocol mode reads; every other one goes upstream as the bytes the client sent
# (msgspec.Raw), so what the proxy does not read (a number past a double's range, text
# that is not UTF-8) is the upstream's to judge, as it is in passthrough.
_READ = frozenset({"stream", "model", "tools", "stream_options", "n"})


def _whole_body(body: bytes, chat: ChatRequest) -> dict[str, Any]:
    """Every field of the request, the messages already decoded once reused."""
    fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])  # values stay undecoded bytes
    return {key: chat.messages if key == "messages" else decode_json(raw, msgspec.json.decode) if key in _READ else raw for key, raw in fields.items()}


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
    """Liveness for anyone; what the proxy fronts only for a proxy key, when it has keys."""
    services = _services(request)
    return {"status": "ok", "upstream": services.upstream.shown_url} if services.shows_details(request.headers) else {"status": "ok"}


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any]) -> str:
    services = _services(request)
    services.check_metrics_key(request.headers)
    return services.metrics.exposition()


ROUTES = [chat_completions, list_models, retrieve_model, healthz, metrics]
