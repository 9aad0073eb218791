"""Dense recall from the upstream's own embedding model (``PCP_EMBEDDINGS_UPSTREAM=<model>``).

A hosted provider's embedding model (an OpenAI ``text-embedding-3-*``, or a
local server's) ranks far better than the bundled MiniLM, for fractions of a
cent and no weights to ship. Page texts are sent to the upstream's
``/v1/embeddings`` in batches by a background task, and their vectors kept in
memory and on disk by a hash of the text (and of the upstream and model that
made them), as the bundled encoder keeps its own: no text is sent twice.
Until a history's vectors are in, its pages are ranked by BM25 alone. The
query is embedded by the same model on the request path, the call started
as the request's paging starts.

When a call fails (refused, unreachable, too slow, an answer that is not
embeddings), the bundled encoder, if installed, serves dense recall instead
for ``retry_seconds``; then the upstream is asked again. Calls carry
``x-pcp-role: embeddings`` and the request's own authorization.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .. import headers as pcp
from ..errors import PcpError, UpstreamError
from ..storage.base import Store
from ..upstream import Upstream
from .stored_vectors import stored_vectors
from .vectors import VectorCache, bounded, unit_rows

__all__ = ["UpstreamVectors", "decoded", "done"]

log = logging.getLogger("pcp.embeddings")

BATCH_TEXTS = 64  # texts a background call sends
QUERY_TIMEOUT = 5.0  # seconds a request waits for its query's vector
BATCH_TIMEOUT = 60.0
RETRY_SECONDS = 60.0  # after a failed call, the bundled encoder serves this long


class _Item(msgspec.Struct):
    embedding: list[float]
    index: int = 0


class _Embeddings(msgspec.Struct):
    data: list[_Item]


_DECODER = msgspec.json.Decoder(_Embeddings)


def done(value: Any = None) -> asyncio.Future[Any]:
    """A future that is already done: what is awaited when there is nothing to wait for."""
    future = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _ours(headers: Mapping[str, str] | None) -> dict[str, str]:
    """A request's headers as an embeddings call of the proxy's own carries them."""
    return {**(headers or {}), pcp.ROLE: "embeddings", "content-type": "application/json"}


def decoded(body: bytes, texts: int) -> Any:
    """The unit vectors of an ``/embeddings`` answer, in input order; ValueError when it is not one for ``texts`` texts."""
    try:
        items = sorted(_DECODER.decode(body).data, key=lambda item: item.index)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not an embeddings answer: {exc}") from None
    if len(items) != texts or len({len(item.embedding) for item in items}) != 1:
        raise ValueError(f"{len(items)} embeddings of unequal or no length for {texts} texts")
    return unit_rows([item.embedding for item in items])


class UpstreamVectors:
    """What the rounds ask of an embedder (``proxy.app.DenseRecall``), answered by the upstream's embedding model."""

    def __init__(
        self,
        upstream: Upstream,
        model: str,
        directory: Path | None = None,
        *,
        fallback: Any = None,
        on_call: Callable[[], None] | None = None,
        on_encoded: Callable[[str, int], None] | None = None,
        batch_texts: int = BATCH_TEXTS,
        retry_seconds: float = RETRY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        store: Store | None = None,
    ):
        """Vectors from the upstream's ``/embeddings`` for ``model``, ``fallback`` while it fails."""
        self.upstream, self.model, self.fallback = upstream, model, fallback
        self.variant = hashlib.sha256(f"upstream|{upstream.shown_url}|{model}".encode()).digest()
        self.cache = VectorCache(200_000, self.variant)
        self.stored = stored_vectors(self.cache, store, directory)
        self.on_call = on_call or (lambda: None)
        self.on_encoded = on_encoded or (lambda state, n: None)
        self.batch_texts, self.retry_seconds, self.clock = batch_texts, retry_seconds, clock
        self.failed_at: float | None = None
        self._queries: dict[str, asyncio.Task[Any]] = {}
        self._pending: set[str] = set()
        # Texts to embed, with the headers of the request that asked: a call carries that caller's authorization.
        self._queue: asyncio.Queue[tuple[list[str], dict[str, str]]] | None = None
        self._task: asyncio.Task[None] | None = None

    # -- for requests ----------------------------------------------------------------
    def prefetch(self, text: str, headers: Mapping[str, str] | None = None) -> Awaitable[Any]:
        """Start embedding the query now (or, while the upstream is failing, the fallback's)."""
        if self.failing:
            return self.fallback.prefetch(text, headers) if self.fallback is not None else done()
        self._queries = {t: task for t, task in self._queries.items() if not task.done()}  # a vector that landed is cached
        if text not in self._queries:
            self._queries[text] = asyncio.ensure_future(self._query_vector(text, _ours(headers)))
        return self._queries[text]

    async def similarities_when_ready(self, query: str, texts: Sequence[str], headers: Mapping[str, str] | None = None) -> Any | None:
        """The query's cosine with each of ``texts`` whose vector is in, NaN for the others (queued); None when none is.

        ``headers``: the request's, whose authorization the calls for it carry.
        """
        texts = [bounded(t) for t in texts]  # a text's head, as the bundled encoder is given it: an upstream's inputs are bounded too
        if not self.failing:
            task = self._queries.pop(query, None)
            vector = await task if task is not None else None
            if vector is None and not self.failing:
                vector = await self._query_vector(query, _ours(headers))
            if vector is not None:
                cosines = self.cache.cosines(texts, vector)
                missing = np.isnan(cosines)
                self._enqueue([texts[i] for i in np.flatnonzero(missing).tolist()], _ours(headers))
                return None if missing.all() else cosines
        if self.fallback is not None:
            return await self.fallback.similarities_when_ready(query, texts, headers)
        return None

    @property
    def failing(self) -> bool:
        """Whether the upstream failed within ``retry_seconds``."""
        return self.failed_at is not None and self.clock() - self.failed_at < self.retry_seconds

    def serving(self) -> Any:
        """The fallback's context while a request is served, if there is one."""
        return self.fallback.serving() if self.fallback is not None else nullcontext()

    def close(self) -> None:
        """Stop the background, and close the fallback and the store."""
        if self._task is not None:
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)
        if self.fallback is not None:
            self.fallback.close()
        if self.stored is not None:
            self.stored.close()

    # -- the calls -------------------------------------------------------------------
    async def _query_vector(self, text: str, headers: dict[str, str]) -> Any | None:
        """The query's vector: cached, or asked of the upstream; None if it fails."""
        text = bounded(text)
        found = self.cache.found([text])
        if text in found:
            return found[text]
        vectors = await self._embed([text], QUERY_TIMEOUT, headers)
        if vectors is None:
            return None
        self.cache.add({text: vectors[0]})
        return vectors[0]

    async def _embed(self, texts: list[str], timeout: float, headers: dict[str, str]) -> Any | None:
        """The unit vectors of ``texts`` from the upstream, or None when the call failed (the fallback then serves)."""
        self.on_call()
        body = json.dumps({"model": self.model, "input": texts}).encode()
        try:
            status, media_type, raw = await asyncio.wait_for(self._post(body, timeout, headers), timeout)
            if status >= 400:
                raise UpstreamError.refused(status, raw, media_type)
            return await asyncio.to_thread(decoded, raw, len(texts))
        except (TimeoutError, PcpError, ValueError) as error:
            if not self.failing:
                log.warning(
                    "embeddings model %s on the upstream failed (%s): %s for %.0f s",
                    self.model,
                    getattr(error, "status", type(error).__name__),
                    "the bundled encoder serves" if self.fallback else "BM25 alone ranks",
                    self.retry_seconds,
                )
            self.failed_at = self.clock()
            return None

    async def _post(self, body: bytes, timeout: float, headers: dict[str, str]) -> tuple[int, str | None, bytes]:
        """One ``POST /embeddings``: its status, content type and body."""
        response = await self.upstream.open("POST", "/embeddings", content=body, headers=headers, timeout=timeout)
        return response.status_code, response.headers.get("content-type"), await self.upstream.read(response)

    # -- the background --------------------------------------------------------------
    def _enqueue(self, texts: list[str], headers: dict[str, str]) -> None:
        """``texts`` queued for the background to embed."""
        texts = [t for t in dict.fromkeys(texts) if t not in self._pending]
        if not texts:
            return
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.ensure_future(self._run())
        self._pending.update(texts)
        self.on_encoded("queued", len(texts))
        self._queue.put_nowait((texts, headers))

    async def _run(self) -> None:
        """The background: embed what is queued, a failure lost for those texts alone."""
        assert self._queue is not None
        while True:
            texts, headers = await self._queue.get()
            try:
                await self._fill(texts, headers)
            except Exception:  # dense recall is lost for these texts, never a request
                log.exception("embedding %d texts upstream failed", len(texts))
            finally:
                self._pending.difference_update(texts)

    async def _fill(self, texts: list[str], headers: dict[str, str]) -> None:
        """``texts`` read from the store, the rest asked of the upstream in batches."""
        loaded = await asyncio.to_thread(self._from_disk, texts)
        if loaded:
            self.on_encoded("loaded", len(loaded))
        absent = [t for t in texts if t not in loaded]
        for start in range(0, len(absent), self.batch_texts):
            batch = absent[start : start + self.batch_texts]
            vectors = None if self.failing else await self._embed(batch, BATCH_TIMEOUT, headers)
            if vectors is None:  # asked again by a later request, once the upstream is retried
                self.on_encoded("failed", len(absent) - start)
                return
            await asyncio.to_thread(self._keep, batch, vectors)
            self.on_encoded("encoded", len(batch))

    def _from_disk(self, texts: Sequence[str]) -> dict[str, Any]:
        """The vectors of ``texts`` the store holds."""
        return self.stored.get(texts) if self.stored is not None else {}

    def _keep(self, texts: Sequence[str], vectors: Any) -> None:
        """Vectors kept in memory and in the store."""
        self.cache.add(dict(zip(texts, vectors)))
        if self.stored is not None:
            self.stored.put(texts, vectors)
