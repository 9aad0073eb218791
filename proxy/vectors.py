"""Unit vectors by text, in memory: what dense recall compares a query with, whichever encoder made them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["VectorCache", "unit_rows"]

GATHER_BLOCK = 2048  # rows gathered at once when comparing a history with a query: stays in cache


def unit_rows(vectors: Any) -> Any:
    """``vectors`` (one a row) scaled to length 1, as float32; a zero row stays zero."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1)


class VectorCache:
    """Unit vectors by text, rows of one growing matrix: a history's thousands of
    rows come out in one gather, not one lookup and copy each.

    When full, the older half is dropped (a history's texts were stored together,
    so they go together). Safe to share between threads.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._rows: dict[str, int] = {}
        self._matrix: Any = None  # allocated with the first vector, when its size is known
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def found(self, texts: Sequence[str]) -> dict[str, Any]:
        """The vectors held for ``texts``, by text."""
        with self._lock:
            return {t: self._matrix[row] for t in texts if (row := self._rows.get(t)) is not None}

    def cosines(self, texts: Sequence[str], vector: Any) -> Any:
        """Each text's cosine with the unit ``vector`` (NaN for a text not held).

        Rows are gathered and multiplied a block at a time: a history's rows
        never become one more matrix of their own.
        """
        out = np.full(len(texts), np.nan, dtype=np.float32)
        with self._lock:
            rows = np.fromiter((self._rows.get(t, -1) for t in texts), dtype=np.int64, count=len(texts))
            held = np.flatnonzero(rows >= 0)
            for block in range(0, len(held), GATHER_BLOCK):
                at = held[block : block + GATHER_BLOCK]
                out[at] = self._matrix[rows[at]] @ vector
        return out

    def add(self, vectors: dict[str, Any]) -> None:
        with self._lock:
            new = {t: v for t, v in vectors.items() if t not in self._rows}
            if not new:
                return
            if len(self._rows) + len(new) > self.capacity:
                self._drop_older_half()
            self._make_room(len(self._rows) + len(new), len(next(iter(new.values()))))
            start = len(self._rows)
            self._matrix[start : start + len(new)] = np.stack(list(new.values()))
            self._rows.update(zip(new, range(start, start + len(new))))

    def _make_room(self, rows: int, dim: int) -> None:
        if self._matrix is None:
            self._matrix = np.empty((max(rows, min(1024, self.capacity)), dim), dtype=np.float32)
        elif rows > len(self._matrix):
            grown = np.empty((max(rows, min(2 * len(self._matrix), self.capacity)), dim), dtype=np.float32)
            grown[: len(self._rows)] = self._matrix[: len(self._rows)]
            self._matrix = grown

    def _drop_older_half(self) -> None:
        keep = len(self._rows) // 2
        cut = len(self._rows) - keep
        self._matrix[:keep] = self._matrix[cut : len(self._rows)].copy()
        self._rows = {t: row - cut for t, row in self._rows.items() if row >= cut}
