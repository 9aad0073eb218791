"""``create_app(settings)``: the Litestar application and the resources its lifespan owns."""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from litestar import Litestar
from litestar.datastructures import State

from pcp_core.sentry import PagingPolicy, Sentry

from .consolidator import ModelConsolidator
from .embeddings import Embedder, embeddings_available
from .errors import ProxyError, exception_handlers
from .local_model import LocalModel
from .metrics import Metrics
from .routes import ROUTES
from .sessions import SessionStore
from .settings import Settings
from .tokenizer import Tokenizer
from .upstream import Upstream, forwardable

__all__ = ["Services", "create_app"]

log = logging.getLogger("pcp.proxy")

YOUNG_GENERATION = 20_000  # see _collect_less_often


@dataclass
class Services:
    """What a request handler needs; built once per app by the lifespan."""

    settings: Settings
    tokenizer: Tokenizer
    upstream: Upstream = field(init=False)
    local_model: LocalModel | None = None
    embedder: Embedder | None = None
    sentry: Sentry = field(init=False)
    sessions: SessionStore = field(init=False)
    metrics: Metrics = field(default_factory=Metrics)
    consolidator: ModelConsolidator | None = None

    def __post_init__(self) -> None:
        self.sentry = Sentry(threshold=self.settings.sentry_threshold)

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
            raise ProxyError(401, "this proxy requires an API key: send 'Authorization: Bearer <key>'", "invalid_request_error", code="missing_api_key")
        if not any(hmac.compare_digest(presented, k.encode()) for k in self.settings.api_keys):
            raise ProxyError(401, "the API key presented is not valid for this proxy", "invalid_request_error", code="invalid_api_key")


def _freeze_imports() -> None:
    """Leave what the imports made out of every later garbage collection.

    torch and sentence-transformers bring ~400,000 objects the collector
    tracks; a full collection walked them all (~270 ms at a request's
    expense, now and then). They live as long as the process, so the
    collector gains nothing from looking at them again.
    """
    gc.freeze()


def _collect_less_often() -> None:
    """Collect the young generation once 20,000 more objects live than at the last collection, not 700.

    A follow-up on a long history makes and drops tens of thousands of
    objects, which reference counting frees; at 700 the collector ran ~8
    times a request (~1.8 ms at 200k tokens) and found nothing to collect.
    """
    gc.set_threshold(YOUNG_GENERATION, *gc.get_threshold()[1:])


def create_app(settings: Settings) -> Litestar:
    services = Services(settings=settings, tokenizer=Tokenizer(settings.tokenizer))
    _collect_less_often()

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        base_url = settings.upstream_base_url
        if not base_url:
            services.local_model = LocalModel(settings.data_path, settings.local_n_ctx)
            base_url = await services.local_model.start()
        services.sessions = SessionStore(settings.data_path / "sessions")
        services.upstream = Upstream(
            base_url,
            connect_timeout=settings.upstream_connect_timeout,
            read_timeout=settings.upstream_read_timeout,
        )
        if settings.router_embeddings and embeddings_available():
            services.embedder = Embedder(settings.data_path / "embeddings", on_encoded=lambda state, n: services.metrics.inc("pcp_texts_embedded_total", n, state=state))
            # Loading takes seconds; passthrough traffic need not wait for it.
            loading = asyncio.get_running_loop().run_in_executor(None, services.embedder.load)
            loading.add_done_callback(lambda _: _freeze_imports())
        else:
            _freeze_imports()
            if settings.router_embeddings:
                log.warning("router_embeddings is on but the embeddings extra is not installed: pages are addressed by BM25 alone")
        if settings.consolidator == "llm":
            services.consolidator = ModelConsolidator(settings.data_path / "summaries", services.upstream, services.metrics, PagingPolicy().summary_chars)
            services.consolidator.start()
        log.info("pcp-proxy forwarding to %s", services.upstream.shown_url)
        try:
            yield
        finally:
            if services.embedder is not None:
                await loading
                await asyncio.to_thread(services.embedder.close)
            if services.consolidator is not None:
                await services.consolidator.stop()
            await services.upstream.aclose()
            await asyncio.to_thread(services.sessions.close)
            if services.local_model is not None:
                await services.local_model.stop()

    return Litestar(
        route_handlers=ROUTES,
        lifespan=[lifespan],
        exception_handlers=exception_handlers,
        request_max_body_size=settings.max_body_mb * 2**20,
        state=State({"services": services}),
        openapi_config=None,
        logging_config=None,
    )
