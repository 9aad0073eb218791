"""Sentence embeddings for the Router's dense recall: MiniLM (or mpnet), offline, cached by text.

The model ships inside a package (``proxy.recall.encoders``), so nothing is
downloaded. Its linear layers run in int8 (torch's dynamic quantization): a
query encodes in about half the time, and on LoCoMo recall is the same within
a point (``bench/recall.py``). A text is encoded once: vectors are kept in memory and in the store
(``proxy.recall.stored_vectors``: diskcache in a directory, or Redis, by a hash of the
text), so neither a follow-up nor a restart — nor, with Redis, another
replica — encodes a history again.

Nothing of the model is loaded, nor torch imported, until a request wants
dense recall: a proxy that forwards stays small (``bench/lean.py`` measures
its memory idle). One instance of the model serves both the requests (a query, by a
TorchScript trace that computes without the interpreter, while the request
pages its history) and the background (batches, one at a time): the trace
and a batch may run at once, on the same weights.

A request never waits for a history to be encoded (seconds for a long one on
two cores) or read back from disk: ``similarities_when_ready`` encodes the query
at once, and hands the history's texts it does not hold in memory to a
background thread; until they land, those turns are ranked by BM25 alone.
The background gives way to requests: it encodes while none is being served,
or after waiting ``yield_seconds`` for one, a few batches at a time — a
follow-up's new texts are encoded once its answer is out, not while its
pages are addressed (both need the interpreter).

What waits to be encoded is bounded (``max_queue_bytes``, the encoder's
share of ``cache_mb``): past it, the texts queued first are shed, as the
caches drop what was used least recently. A shed text is not lost: the
next request that ranks it finds no vector, ranks it by BM25 alone, and
queues it again (its vector read from the store if it was encoded before).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..resident import give_back
from ..storage.base import Store
from .encoders import ENCODERS, model_path
from .stored_vectors import stored_vectors
from .vectors import ENCODED_CHARS, VectorCache, bounded, torch_widened

__all__ = ["Embedder", "embeddings_available", "prepare_process"]

log = logging.getLogger("pcp.embeddings")

# Encoding threads per call. With one, a history encoded in the background
# leaves the other core to requests; a short query encodes about as fast on one.
TORCH_THREADS = 1
# The background encodes this many batches between two looks at the requests being served,
# and waits at most this long for them, so it never starves.
BATCHES_BETWEEN_YIELDS = 4
YIELD_SECONDS = 0.25
# Once this many texts were taken in a row (a history, not a follow-up's new turns) the background gives back what
# its batches freed (``proxy.resident.give_back``), after each step: a follow-up would fault those pages in again
# if it were done after every encoding, a follow-up's few texts too.
GIVE_BACK_TEXTS = 256
# What a queued text costs beyond its own object: its slot in the queue and its entry in the set of those queued.
QUEUED_TEXT = 40


def prepare_process() -> None:
    """Ready this process for the model, as it is first loaded (in the background thread).

    Nothing is fetched from a hub; encoding takes one thread (TORCH_THREADS),
    leaving the other core to requests; and what torch brings (~100,000s of
    objects, alive as long as the process) is left out of every later garbage
    collection: a full collection walked them all, at some request's expense.
    """
    import gc

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(TORCH_THREADS)
    gc.freeze()  # no collection first: it would hold the interpreter from the requests being served


def embeddings_available(encoder: str = "minilm") -> bool:
    """Whether sentence-transformers and ``encoder``'s weights (``proxy.recall.encoders.ENCODERS``) are installed."""
    import importlib.util

    return importlib.util.find_spec("sentence_transformers") is not None and ENCODERS[encoder].available()


class Embedder:
    def __init__(
        self,
        directory: Path | None = None,
        cache_size: int = 200_000,
        batch_size: int = 64,
        on_encoded: Callable[[str, int], None] | None = None,
        yield_seconds: float | None = None,
        encoder: str = "minilm",
        models_dir: Path | None = None,
        store: Store | None = None,
        max_bytes: int = 0,
        max_queue_bytes: int = 0,
    ):
        """An embedder of ``encoder``'s model, its vectors cached in memory and stored beside ``directory``."""
        self.encoder = ENCODERS[encoder]
        # Where a model that comes in parts is joined (``proxy.recall.encoders``).
        self.models_dir = models_dir or (directory.parent / "models" if directory is not None else Path.home() / ".cache" / "pcp-proxy" / "models")
        self.cache = VectorCache(cache_size, self.encoder.variant, max_bytes)
        self.stored = stored_vectors(self.cache, store, directory)
        self.batch_size = batch_size
        self.yield_seconds = YIELD_SECONDS if yield_seconds is None else yield_seconds
        self._serving = 0
        self._quiet = threading.Condition()
        # Called with ("queued" | "encoded" | "loaded" | "elsewhere" | "failed", number of texts) for background work
        # ("elsewhere": another process claimed them, and announces them when it has encoded them).
        self.on_encoded = on_encoded or (lambda state, n: None)
        self._loaded: Any = None  # the model (``bert.BertEncoder`` or ``sentence_model.SentenceModel``), once loaded
        self._load_lock = threading.Lock()
        self._batch_lock = threading.Lock()  # one batch at a time; a query's trace runs beside it
        self._queue_lock = threading.Lock()  # requests and the background thread share the queue
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcp-embed")
        self.max_queue_bytes = max_queue_bytes  # what the texts waiting may hold (0: unbounded); past it the first queued are shed
        self._waiting: deque[str] = deque()  # texts for the background, the first queued first
        self._queued: set[str] = set()  # those waiting, and those being encoded
        self._waiting_bytes = 0
        self._draining = False  # the background is at the queue, or is to be
        self._closed = False
        self._loading: Future[None] | None = None
        self._weights = 0  # the loaded model's bytes, counted once: unpacking its int8 layers is too slow for every /metrics scrape

    def close(self) -> None:
        """Stop the background and close the store."""
        self._closed = True  # the background stops after its step
        self._background.shutdown(wait=True, cancel_futures=True)
        if self.stored is not None:
            self.stored.close()

    def load(self) -> None:
        """Load the model now; blocking, seconds."""
        self._model()

    @property
    def ready(self) -> bool:
        """Whether the model is loaded."""
        return self._loaded is not None

    def warm_up(self) -> None:
        """Load the model in the background, once: the first request that wants dense recall asks.

        A proxy that only forwards never loads it, and no request waits for it:
        until it is loaded, pages are ranked by BM25 alone. It loads once the
        requests being served are answered (or ``yield_seconds`` have passed),
        as the background encodes: importing torch is seconds of work under the
        interpreter lock, taken from the request that asked for the model (which
        cannot use it: none of its texts is encoded yet).
        """
        with self._queue_lock:
            if self._loading is None:
                self._loading = self._background.submit(self._load_quietly)

    def _load_quietly(self) -> None:
        """Load the model once the requests are served; a failure is logged, and ranking goes on with BM25 alone."""
        try:
            self._wait_for_quiet()  # (see ``warm_up``)
            self.load()
        except Exception:  # dense recall is lost, never a request
            log.exception("the embedding model did not load: pages are ranked by BM25 alone")

    def _model(self) -> Any:
        """The model, loaded once (the bundled encoder, or sentence-transformers for the others)."""
        with self._load_lock:
            if self._loaded is None:
                prepare_process()
                directory = model_path(self.encoder, self.models_dir)
                if self.encoder.runtime == "bert":
                    from .bert import BertEncoder

                    self._loaded = BertEncoder(directory)
                else:
                    from .sentence_model import SentenceModel

                    self._loaded = SentenceModel(directory, self.batch_size)
                self.cache.widen = torch_widened  # torch is in now: the history's rows are widened by it
                log.info("embedding model %s loaded", self.encoder.name)
            return self._loaded

    @property
    def queued_bytes(self) -> int:
        """What the texts waiting to be encoded hold."""
        return self._waiting_bytes

    @property
    def resident_bytes(self) -> int:
        """What the model's weights hold (the libraries it needs are not counted)."""
        if self._loaded is not None and not self._weights:
            self._weights = _weights_bytes(self._loaded)  # the weights never change once loaded
        return self._weights

    # -- for requests --------------------------------------------------------------------
    @property
    def requests_served(self) -> int:
        """Requests being served now: the background does not start encoding while there are any."""
        return self._serving

    @contextmanager
    def serving(self) -> Iterator[None]:
        """While a request is served, the background does not start encoding (see ``yield_seconds``)."""
        with self._quiet:
            self._serving += 1
        try:
            yield
        finally:
            with self._quiet:
                self._serving -= 1
                self._quiet.notify_all()

    async def similarities_when_ready(self, query: str, texts: Sequence[str], headers: Mapping[str, str] | None = None) -> Any | None:
        """The cosine of ``query`` (encoded now) with each of ``texts``, as far as they are in memory.

        A text not there yet has NaN, and goes to the background thread, so a
        later request finds it. None when none of them is there: there is
        nothing to compare the query with.
        """
        return await asyncio.to_thread(self._similarities_sync, query, texts)

    def prefetch(self, text: str, headers: Mapping[str, str] | None = None) -> Awaitable[Any]:
        """Start encoding ``text`` (a query) in a thread, if it is not cached, so a request's paging and encoding overlap.

        Handed to a thread now, not in a task: a task would start only once paging had.
        """
        return asyncio.get_running_loop().run_in_executor(None, self._prefetch_sync, text)

    def _prefetch_sync(self, text: str) -> None:
        """Best effort: a request that fails before it awaits this (its store down, say) leaves no exception unretrieved."""
        if not self.ready:
            return
        try:
            self.embed_sync([text])
        except Exception as error:  # dense recall encodes it again, or goes without it
            log.debug("a query's vector was not prefetched: %s", error)

    def embed_sync(self, texts: Sequence[str], role: str = "request") -> Any:
        """The vectors of ``texts``: from memory, from the store, or encoded now."""
        texts = [bounded(t) for t in texts]  # memory bounded whatever a text's size: the model reads its head alone
        found = self.cache.found(texts)
        absent = [t for t in dict.fromkeys(texts) if t not in found]
        if absent:
            found.update(self._from_disk(absent))
            absent = [t for t in absent if t not in found]
        if absent:
            found.update(zip(absent, self._encode(absent, role)))
        return np.vstack([found[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)

    def vectors(self, texts: Sequence[str]) -> Any:
        """The vectors of ``texts``, for a store that indexes them (memory): encoded by the background instance,
        so a request's query never waits behind them; cached as a history's are, so the rounds find them."""
        return self.embed_sync(texts, role="background")

    def _similarities_sync(self, query: str, texts: Sequence[str]) -> Any | None:
        """The query's cosines with ``texts`` (NaN where a text is not encoded yet, queued), or None while none is."""
        if texts and max(map(len, texts)) > ENCODED_CHARS:  # (a history's texts are short: most often none is cut)
            texts = [bounded(t) for t in texts]  # as embed_sync names them in the cache
        if not self.ready:
            self.warm_up()
            self._queue(list(dict.fromkeys(texts)))  # encoded once the model is in
            return None
        cosines = self.cache.cosines(texts, self.embed_sync([query])[0])
        missing = np.isnan(cosines)
        self._queue(list(dict.fromkeys(texts[i] for i in np.flatnonzero(missing).tolist())))
        return None if missing.all() else cosines

    def _from_disk(self, texts: Sequence[str]) -> dict[str, Any]:
        """The vectors the store holds (another process, or a run before, encoded them)."""
        return self.stored.get(texts) if self.stored is not None else {}

    def _encode(self, texts: Sequence[str], role: str = "request") -> Any:
        """``texts`` encoded and kept in memory."""
        model = self._model()
        if role == "request" and len(texts) == 1:
            vectors = np.asarray(model.one(texts[0]), dtype=np.float32)[np.newaxis]
        else:
            # In the background, what each batch freed is given back before the next: glibc kept it, and the
            # next batch's blocks of other sizes came from more of the heap (bert.py's BATCH_TOKENS).
            between = give_back if role == "background" else None
            with self._batch_lock:
                vectors = np.asarray(model.batch(texts, between), dtype=np.float32)
        self.cache.add(dict(zip(texts, vectors)))
        if self.stored is not None:
            self.stored.put(texts, vectors)
        return vectors

    # -- the background ---------------------------------------------------------------------
    def _queue(self, texts: list[str]) -> None:
        """Queue ``texts`` for the background, and shed the first queued past ``max_queue_bytes``."""
        shed = 0
        with self._queue_lock:
            texts = [t for t in texts if t not in self._queued]
            self._queued.update(texts)
            self._waiting.extend(texts)
            self._waiting_bytes += sum(map(_queued_size, texts))
            while self.max_queue_bytes and self._waiting_bytes > self.max_queue_bytes and self._waiting:
                first = self._waiting.popleft()
                self._queued.discard(first)
                self._waiting_bytes -= _queued_size(first)
                shed += 1
            start = bool(texts) and not self._draining
            self._draining = self._draining or start
        if texts:
            self.on_encoded("queued", len(texts))
        if shed:
            self.on_encoded("shed", shed)
        if start:
            self._background.submit(self._drain)

    def _drain(self) -> None:
        """Encode what is queued, a step at a time, giving way to requests between steps, until nothing is."""
        try:
            self._drain_steps()
        except BaseException:
            with self._queue_lock:
                self._draining = False  # the next text queued starts it again
            raise

    def _drain_steps(self) -> None:
        """Encode what is queued, a few batches at a time, giving way to the requests between."""
        step = self.batch_size * BATCHES_BETWEEN_YIELDS
        run = 0  # texts taken since the queue was last empty
        while True:
            self._wait_for_quiet()
            with self._queue_lock:
                part = [self._waiting.popleft() for _ in range(min(step, len(self._waiting)))] if not self._closed else []
                self._waiting_bytes -= sum(map(_queued_size, part))
                if not part:
                    self._draining = False
                    return
            try:
                self._load_or_encode(part)
            finally:
                with self._queue_lock:
                    self._queued.difference_update(part)
            run += len(part)
            if run >= GIVE_BACK_TEXTS:
                give_back()  # what a history's batches freed: kept, it is hundreds of MB nothing uses

    def _load_or_encode(self, texts: list[str]) -> None:
        """``texts`` read from the store, the rest encoded and stored."""
        done = 0
        try:
            loaded = self._from_disk(texts)
            if loaded:
                self.on_encoded("loaded", len(loaded))
            done = len(loaded)
            absent = [t for t in texts if t not in loaded]
            if self.stored is not None:  # a text another process claimed is encoded there, and announced
                claimed = self.stored.claim(absent)
                if len(claimed) < len(absent):
                    self.on_encoded("elsewhere", len(absent) - len(claimed))
                done, absent = len(texts) - len(claimed), claimed
            if absent:
                self._encode(absent, role="background")
                self.on_encoded("encoded", len(absent))
        except Exception:  # a failed encode costs dense recall, never a request
            log.exception("encoding %d texts in the background failed", len(texts) - done)
            self.on_encoded("failed", len(texts) - done)

    def _wait_for_quiet(self) -> None:
        """Until no request is being served, or ``yield_seconds`` have passed."""
        with self._quiet:
            self._quiet.wait_for(lambda: self._serving == 0, timeout=self.yield_seconds)


def _queued_size(text: str) -> int:
    """What a queued text costs in memory."""
    return sys.getsizeof(text) + QUEUED_TEXT


def _weights_bytes(model: Any) -> int:
    """The bytes of a loaded model's parameters and its int8 layers' packed weights."""
    import torch

    module = getattr(model, "model", None)
    if not isinstance(module, torch.nn.Module):
        return 0
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    for layer in module.modules():
        if isinstance(layer, torch.ao.nn.quantized.dynamic.Linear):
            weight, bias = layer._weight_bias()
            total += weight.numel() * weight.element_size() + (bias.numel() * bias.element_size() if bias is not None else 0)
    return total
