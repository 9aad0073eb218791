"""Where vectors are kept: in memory by text (``VectorCache``), and in the store by a digest of the text (``StoredVectors``).

A text's vector is kept under a keyed digest of the text and the model
(``text_key``): the vectors of another model are never read, and the store
holds no text. With Redis, every process shares them: a process that
encodes texts announces their digests on a stream, every other one reads
the stream and takes the vectors into memory, where its requests find them
(``listen``); a process that starts takes the latest ones; and a text is
encoded by the one process that claims it first (``claim``), the others
waiting for its announcement.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .stores.base import Store, StoreUnavailable

__all__ = ["StoredVectors", "VectorCache", "text_key"]

log = logging.getLogger("pcp.embeddings")

GATHER_BLOCK = 2048  # rows gathered at once when comparing a history with a query: stays in cache
# Names the vectors in the store: another model (or the fp32 one) must not find them.
MODEL_VARIANT = b"all-MiniLM-L6-v2/int8"
CLAIM_SECONDS = 120.0  # a text claimed by a process that dies is free again after this
WARM_START = 50_000  # vectors a starting process takes from the store's latest announcements


def text_key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16, key=MODEL_VARIANT).digest()


class VectorCache:
    """Unit vectors by text, rows of one growing matrix: a history's thousands of
    rows come out in one gather, not one lookup and copy each.

    Rows another process encoded are known by their text's digest until a
    request names the text. When full, the older half is dropped (a history's
    texts were stored together, so they go together). Safe to share between threads.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._rows: dict[str, int] = {}
        self._digested: dict[bytes, int] = {}  # rows announced by digest, their text not seen here yet
        self._matrix: Any = None  # allocated with the first vector, when its size is known
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows) + len(self._digested)

    def _row(self, text: str) -> int:
        """The row of ``text`` (-1: none); one known by its digest is known by its text from now on. Lock held."""
        row = self._rows.get(text, -1)
        if row < 0 and self._digested:
            row = self._digested.pop(text_key(text), -1)
            if row >= 0:
                self._rows[text] = row
        return row

    def found(self, texts: Sequence[str]) -> dict[str, Any]:
        """The vectors held for ``texts``, by text."""
        with self._lock:
            return {t: self._matrix[row] for t in texts if (row := self._row(t)) >= 0}

    def cosines(self, texts: Sequence[str], vector: Any) -> Any:
        """Each text's cosine with the unit ``vector`` (NaN for a text not held).

        Rows are gathered and multiplied a block at a time: a history's rows
        never become one more matrix of their own.
        """
        out = np.full(len(texts), np.nan, dtype=np.float32)
        with self._lock:
            rows = np.fromiter((self._rows.get(t, -1) for t in texts), dtype=np.int64, count=len(texts))
            if self._digested:  # only the texts not held by name pay for a digest
                for i in np.flatnonzero(rows < 0):
                    rows[i] = self._row(texts[i])
            held = np.flatnonzero(rows >= 0)
            for block in range(0, len(held), GATHER_BLOCK):
                at = held[block : block + GATHER_BLOCK]
                out[at] = self._matrix[rows[at]] @ vector
        return out

    def add(self, vectors: dict[str, Any]) -> None:
        with self._lock:
            self._add({t: v for t, v in vectors.items() if self._row(t) < 0}, self._rows)

    def add_digested(self, vectors: dict[bytes, Any]) -> None:
        """Vectors by their text's digest (``text_key``): another process encoded them."""
        with self._lock:
            self._add({d: v for d, v in vectors.items() if d not in self._digested}, self._digested)

    def _add(self, new: dict[Any, Any], into: dict[Any, int]) -> None:
        if not new:
            return
        if len(self) + len(new) > self.capacity:
            self._drop_older_half()
        self._make_room(len(self) + len(new), len(next(iter(new.values()))))
        start = len(self)
        self._matrix[start : start + len(new)] = np.stack(list(new.values()))
        into.update(zip(new, range(start, start + len(new))))

    def _make_room(self, rows: int, dim: int) -> None:
        if self._matrix is None:
            self._matrix = np.empty((max(rows, min(1024, self.capacity)), dim), dtype=np.float32)
        elif rows > len(self._matrix):
            grown = np.empty((max(rows, min(2 * len(self._matrix), self.capacity)), dim), dtype=np.float32)
            grown[: len(self)] = self._matrix[: len(self)]
            self._matrix = grown

    def _drop_older_half(self) -> None:
        used = len(self)
        keep = used // 2
        cut = used - keep
        self._matrix[:keep] = self._matrix[cut:used].copy()
        self._rows = {t: row - cut for t, row in self._rows.items() if row >= cut}
        self._digested = {d: row - cut for d, row in self._digested.items() if row >= cut}


class StoredVectors:
    """Vectors in a ``Store`` by ``text_key``; with announcements (Redis), shared by every process as they are encoded."""

    def __init__(self, store: Store, cache: VectorCache):
        self.store = store
        self.cache = cache
        self.announcements = getattr(store, "announcements", lambda name: None)("encoded")
        self._listener: threading.Thread | None = None
        self._stopped = threading.Event()

    def get(self, texts: Sequence[str]) -> dict[str, Any]:
        """The stored vectors of ``texts``, by text (also kept in memory)."""
        raws = self.store.get_many([(text_key(t),) for t in texts])
        found = {t: np.frombuffer(raw, dtype=np.float32) for t, raw in zip(texts, raws) if raw is not None}
        self.cache.add(found)
        return found

    def put(self, texts: Sequence[str], vectors: Any) -> None:
        """Store vectors just encoded, and tell the other processes."""
        keys = [text_key(t) for t in texts]
        self.store.set_many({(k,): v.tobytes() for k, v in zip(keys, vectors)})
        if self.announcements is not None:
            self.announcements.publish(b"".join(keys))

    def claim(self, texts: Sequence[str]) -> list[str]:
        """Those of ``texts`` this process is to encode: no other process claimed them first."""
        if not self.store.shared:
            return list(texts)
        return [t for t in texts if self.store.claim(("claim", text_key(t)), CLAIM_SECONDS)]

    # -- what the others encode ------------------------------------------------------------
    def listen(self) -> None:
        """Take the vectors the other processes announce into memory, in a thread: the latest ones first, then as they come."""
        if self.announcements is None or self._listener is not None:
            return
        self._listener = threading.Thread(target=self._listen, name="pcp-vectors", daemon=True)
        self._listener.start()

    def _listen(self) -> None:
        position = None
        while not self._stopped.is_set():
            try:
                if position is None:
                    position, latest = self.announcements.latest(WARM_START // 64)
                    self._take(latest)
                position, announced = self.announcements.read(position, block_seconds=1.0)
                self._take(announced)
            except StoreUnavailable:
                self._stopped.wait(1.0)  # back when the store is
            except Exception:
                log.exception("reading the vectors other processes encoded failed")
                self._stopped.wait(1.0)

    def _take(self, payloads: list[bytes]) -> None:
        digests = list(dict.fromkeys(p[i : i + 16] for p in payloads for i in range(0, len(p), 16)))
        for start in range(0, len(digests), 1024):
            chunk = digests[start : start + 1024]
            raws = self.store.get_many([(d,) for d in chunk])
            self.cache.add_digested({d: np.frombuffer(raw, dtype=np.float32) for d, raw in zip(chunk, raws) if raw is not None})

    def close(self) -> None:
        self._stopped.set()
        if self._listener is not None:
            self._listener.join(timeout=5)
        self.store.close()
