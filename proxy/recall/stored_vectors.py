"""Vectors in the store, by a digest of the text and the encoder (``proxy.recall.vectors.text_key``).

The vectors of another encoder are never read, and the store holds no
text. With Redis, every process shares them: a process that
encodes texts announces their digests on a stream, every other one reads
the stream and takes the vectors into memory, where its requests find them
(``listen``); a process that starts takes the latest ones; and a text is
encoded by the one process that claims it first (``claim``), the others
waiting for its announcement.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..storage.base import Store, StoreUnavailable
from ..storage.embedded import EmbeddedStore
from .vectors import VectorCache, text_key

if TYPE_CHECKING:  # the redis package is an extra: only a store of it has announcements
    from ..storage.redis_store import Announcements

__all__ = ["StoredVectors", "stored_vectors"]

log = logging.getLogger("pcp.embeddings")

CLAIM_SECONDS = 120.0  # a text claimed by a process that dies is free again after this
WARM_START = 50_000  # vectors a starting process takes from the store's latest announcements


class StoredVectors:
    """Vectors in a ``Store`` by ``text_key`` (with the cache's variant); with announcements (Redis), shared by every process as they are encoded."""

    def __init__(self, store: Store, cache: VectorCache):
        """Vectors kept in ``store`` and taken into ``cache``."""
        self.store = store
        self.cache = cache
        # One stream per encoder: another encoder's vectors (of another size) are never taken in.
        self.announcements: Announcements | None = getattr(store, "announcements", lambda name: None)("encoded:" + cache.variant.hex())
        self._listener: threading.Thread | None = None
        self._stopped = threading.Event()

    def get(self, texts: Sequence[str]) -> dict[str, Any]:
        """The stored vectors of ``texts``, by text (also kept in memory)."""
        raws = self.store.get_many([(text_key(t, self.cache.variant),) for t in texts])
        found = {t: np.frombuffer(raw, dtype=np.float32) for t, raw in zip(texts, raws) if raw is not None}
        self.cache.add(found)
        return found

    def put(self, texts: Sequence[str], vectors: Any) -> None:
        """Store vectors just encoded, and tell the other processes."""
        keys = [text_key(t, self.cache.variant) for t in texts]
        self.store.set_many({(k,): v.tobytes() for k, v in zip(keys, vectors)})
        if self.announcements is not None:
            self.announcements.publish(b"".join(keys))

    def claim(self, texts: Sequence[str]) -> list[str]:
        """Those of ``texts`` this process is to encode: no other process claimed them first."""
        if not self.store.shared:
            return list(texts)
        return [t for t in texts if self.store.claim(("claim", text_key(t, self.cache.variant)), CLAIM_SECONDS)]

    # -- what the others encode ------------------------------------------------------------
    def listen(self) -> None:
        """Take the vectors the other processes announce into memory, in a thread: the latest ones first, then as they come."""
        if self.announcements is None or self._listener is not None:
            return
        self._listener = threading.Thread(target=self._listen, args=(self.announcements,), name="pcp-vectors", daemon=True)
        self._listener.start()

    def _listen(self, announcements: Announcements) -> None:
        """Take in the vectors other processes announce, until stopped."""
        position = None
        while not self._stopped.is_set():
            try:
                if position is None:
                    position, latest = announcements.latest(WARM_START // 64)
                    self._take(latest)
                position, announced = announcements.read(position, block_seconds=1.0)
                self._take(announced)
            except StoreUnavailable:
                self._stopped.wait(1.0)  # back when the store is
            except Exception:
                log.exception("reading the vectors other processes encoded failed")
                self._stopped.wait(1.0)

    def _take(self, payloads: list[bytes]) -> None:
        """The vectors the announced digests name, read from the store into the cache."""
        digests = list(dict.fromkeys(p[i : i + 16] for p in payloads for i in range(0, len(p), 16)))
        for start in range(0, len(digests), 1024):
            chunk = digests[start : start + 1024]
            raws = self.store.get_many([(d,) for d in chunk])
            self.cache.add_digested({d: np.frombuffer(raw, dtype=np.float32) for d, raw in zip(chunk, raws) if raw is not None})

    def close(self) -> None:
        """Stop listening, and close the store."""
        self._stopped.set()
        if self._listener is not None:
            self._listener.join(timeout=5)
        self.store.close()


def stored_vectors(cache: VectorCache, store: Store | None, directory: Path | None) -> StoredVectors | None:
    """Where an encoder keeps its vectors: ``store`` (the app's), else diskcache in ``directory``, else
    nowhere; listening, with Redis, for the vectors the other processes encode, as they do."""
    if store is None and directory is not None:
        store = EmbeddedStore(directory)
    if store is None:
        return None
    stored = StoredVectors(store, cache)
    stored.listen()
    return stored
