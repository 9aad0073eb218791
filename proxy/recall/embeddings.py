"""Sentence embeddings for the Router's dense recall: MiniLM (or mpnet), offline, cached by text.

The model ships inside a package (``proxy.encoders``), so nothing is
downloaded. Its linear layers run in int8 (torch's dynamic quantization): a
query encodes in about half the time (~7 ms on one core, against ~15), and on
LoCoMo recall is the same within a point. A text is encoded once: vectors are kept in memory and in the store
(``proxy.stored_vectors``: diskcache in a directory, or Redis, by a hash of the
text), so neither a follow-up nor a restart — nor, with Redis, another
replica — encodes a history again.

A request never waits for a history to be encoded (seconds for a long one on
two cores) or read back from disk: ``similarities_when_ready`` encodes the query
at once, and hands the history's texts it does not hold in memory to a
background thread; until they land, those turns are ranked by BM25 alone.
The query is encoded by a TorchScript trace of the model (``OneText``), which
computes without the interpreter, while the request pages its history.
The background gives way to requests: it encodes while none is being served,
or after waiting ``yield_seconds`` for one, a few batches at a time — a
follow-up's new texts are encoded once its answer is out, not while its
pages are addressed (both need the interpreter).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.base import Store
from .encoders import ENCODERS, model_path
from .stored_vectors import stored_vectors
from .vectors import VectorCache, bounded

__all__ = ["Embedder", "embeddings_available"]

log = logging.getLogger("pcp.embeddings")

# Encoding threads per call. With one, a history encoded in the background
# leaves the other core to requests; a short query encodes about as fast on one.
TORCH_THREADS = 1
# The background encodes this many batches between two looks at the requests being served,
# and waits at most this long for them, so it never starves.
BATCHES_BETWEEN_YIELDS = 4
YIELD_SECONDS = 0.25
ROLES = ("request", "background")
_QUIET = threading.Lock()  # around quantizing or tracing a model, whose warnings are silenced
# Traced with this text; checked against the model on it and on a text of another length.
TRACE_TEXTS = ("What did we decide about the invoice?", "Melanie adopted a puppy in May 2023, after the support group meeting.")


def prepare_process() -> None:
    """Ready this process for the model, before it serves (``pcp-proxy serve`` calls it).

    Nothing is fetched from a hub; encoding takes one thread (TORCH_THREADS),
    leaving the other core to requests; and what the model's libraries bring
    (~400,000 objects, alive as long as the process) is imported now and left
    out of every later garbage collection: a full collection walked them all,
    ~270 ms at some request's expense.
    """
    import gc

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sentence_transformers  # noqa: F401
    import torch

    torch.set_num_threads(TORCH_THREADS)
    gc.collect()
    gc.freeze()


def _no_progress_bars() -> None:
    """Loading a model draws tqdm bars ("Loading weights"), and they went to the log: none."""
    try:
        import huggingface_hub.utils
        import transformers.utils.logging

        transformers.utils.logging.disable_progress_bar()
        huggingface_hub.utils.disable_progress_bars()
    except (ImportError, AttributeError):  # a version without them draws none
        pass


def embeddings_available(encoder: str = "minilm") -> bool:
    """Whether sentence-transformers and ``encoder``'s weights (``proxy.encoders.ENCODERS``) are installed."""
    import importlib.util

    return importlib.util.find_spec("sentence_transformers") is not None and ENCODERS[encoder].available()


class OneText:
    """The model's vector for one text, from a TorchScript trace of its forward.

    A query is encoded while the request pages its history on the other
    thread. ``SentenceTransformer.encode`` runs module by module in Python and
    needs the interpreter between operations; the paging holds it in 5 ms
    slices, so the two took as long together as one after the other (~38 ms
    against 17 and 19). The trace runs the same operations in C++, without the
    interpreter: ~10 ms alone, ~26 together. For one text the vector is the
    model's (within 1e-6); a batch is left to ``encode``, as its padding is
    what the trace does not follow. If the trace disagrees with the model on
    ``TRACE_TEXTS``, ``of`` gives None and queries are encoded as before.
    """

    def __init__(self, model: Any):
        import torch

        example = model.preprocess([TRACE_TEXTS[0]])
        names = [k for k, v in example.items() if isinstance(v, torch.Tensor)]
        extras = {k: v for k, v in example.items() if k not in names}  # e.g. the modality, a string

        class Positional(torch.nn.Module):  # a trace takes tensors by position, the model a dict of features
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *tensors: Any) -> Any:
                return self.model({**extras, **dict(zip(names, tensors))})["sentence_embedding"]

        self._model = model
        self._names = names
        with torch.inference_mode(), _QUIET, warnings.catch_warnings():
            # The branches the tracer warns of (padding, causal masks) are fixed for one unpadded text.
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            # TorchScript is deprecated in favour of torch.export, whose programs run op by op
            # in Python, and torch.compile, which builds C++ at start; torch is pinned (constraints.txt).
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)  # transformers, on an attribute the tracer reads
            self._traced = torch.jit.trace(Positional().eval(), tuple(example[k] for k in names), check_trace=False)

    @classmethod
    def of(cls, model: Any) -> OneText | None:
        one = cls(model)
        expected = model.encode(list(TRACE_TEXTS), batch_size=1, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        if all(np.allclose(one(text), vector, atol=1e-5) for text, vector in zip(TRACE_TEXTS, expected)):
            return one
        log.warning("the traced embedding model disagrees with the model: queries are encoded without it")
        return None

    def __call__(self, text: str) -> Any:
        import torch

        features = self._model.preprocess([text])
        with torch.inference_mode():
            return self._traced(*(features[k] for k in self._names))[0].numpy()


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
    ):
        self.encoder = ENCODERS[encoder]
        # Where a model that comes in parts is joined (``proxy.encoders``).
        self.models_dir = models_dir or (directory.parent / "models" if directory is not None else Path.home() / ".cache" / "pcp-proxy" / "models")
        self.cache = VectorCache(cache_size, self.encoder.variant)
        self.stored = stored_vectors(self.cache, store, directory)
        self.batch_size = batch_size
        self.yield_seconds = YIELD_SECONDS if yield_seconds is None else yield_seconds
        self._serving = 0
        self._quiet = threading.Condition()
        # Called with ("queued" | "encoded" | "loaded" | "elsewhere" | "failed", number of texts) for background work
        # ("elsewhere": another process claimed them, and announces them when it has encoded them).
        self.on_encoded = on_encoded or (lambda state, n: None)
        # Two instances of the model (~90 MB each): a request's query never queues
        # behind a history being encoded in the background.
        self._models: dict[str, Any] = {}
        self._one_text: OneText | None = None  # the request's model, traced for a query
        self._locks = {role: threading.Lock() for role in ROLES}  # one encode per instance at a time
        self._queue_lock = threading.Lock()  # requests and the background thread share ``_pending``
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcp-embed")
        self._pending: set[str] = set()  # queued for the background, not in memory yet
        self._loading: Future[None] | None = None

    def close(self) -> None:
        self._background.shutdown(wait=True, cancel_futures=True)
        if self.stored is not None:
            self.stored.close()

    def load(self) -> None:
        """Load the model (both instances) now; blocking, seconds."""
        for role in ROLES:
            self._model(role)

    @property
    def ready(self) -> bool:
        return all(role in self._models for role in ROLES)

    def warm_up(self) -> None:
        """Load the model in the background, once: the first request that wants dense recall asks.

        A proxy that only forwards never loads it, and no request waits for it:
        until it is loaded, pages are ranked by BM25 alone.
        """
        with self._queue_lock:
            if self._loading is None:
                self._loading = self._background.submit(self._load_quietly)

    def _load_quietly(self) -> None:
        try:
            self.load()
        except Exception:  # dense recall is lost, never a request
            log.exception("the embedding model did not load: pages are ranked by BM25 alone")

    def _model(self, role: str) -> Any:
        with self._locks[role]:
            if role not in self._models:
                import torch
                from sentence_transformers import SentenceTransformer

                _no_progress_bars()

                model = SentenceTransformer(str(model_path(self.encoder, self.models_dir)), device="cpu")
                with _QUIET, warnings.catch_warnings():  # the filters are global: one thread at a time
                    # Deprecated in favour of the torchao package; torch is pinned (constraints.txt).
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
                    model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)  # see Encoder.variant
                if role == "request":
                    self._one_text = OneText.of(model)
                self._models[role] = model
                log.info("embedding model %s loaded (%s)", self.encoder.name, role)
            return self._models[role]

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
        model = self._model(role)
        one_text = self._one_text if role == "request" and len(texts) == 1 else None
        with self._locks[role]:
            if one_text is not None:
                vectors = one_text(texts[0])[np.newaxis].astype(np.float32)
            else:
                vectors = model.encode(
                    list(texts), batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
                ).astype(np.float32)  # no progress bar: it wrote to the log at each batch
        self.cache.add(dict(zip(texts, vectors)))
        if self.stored is not None:
            self.stored.put(texts, vectors)
        return vectors

    # -- the background ---------------------------------------------------------------------
    def _queue(self, texts: list[str]) -> None:
        with self._queue_lock:
            texts = [t for t in texts if t not in self._pending]
            self._pending.update(texts)
        if texts:
            self.on_encoded("queued", len(texts))
            self._background.submit(self._load_or_encode, texts)

    def _load_or_encode(self, texts: list[str]) -> None:
        done = 0
        try:
            self._wait_for_quiet()
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
            step = self.batch_size * BATCHES_BETWEEN_YIELDS
            for start in range(0, len(absent), step):
                if start:
                    self._wait_for_quiet()
                part = absent[start : start + step]
                self._encode(part, role="background")
                self.on_encoded("encoded", len(part))
                done += len(part)
        except Exception:  # a failed encode costs dense recall, never a request
            log.exception("encoding %d texts in the background failed", len(texts) - done)
            self.on_encoded("failed", len(texts) - done)
        finally:
            with self._queue_lock:
                self._pending.difference_update(texts)

    def _wait_for_quiet(self) -> None:
        """Until no request is being served, or ``yield_seconds`` have passed."""
        with self._quiet:
            self._quiet.wait_for(lambda: self._serving == 0, timeout=self.yield_seconds)
