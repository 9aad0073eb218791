"""Unit vectors by text, in memory: what dense recall compares a query with, whichever encoder made them."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

__all__ = ["ENCODED_CHARS", "VectorCache", "bounded", "text_key", "torch_widened", "unit_rows", "widened"]

GATHER_BLOCK = 2048  # rows gathered at once when comparing a history with a query: stays in cache
# What of a text an encoder is given: its head. The bundled models read their first 256 (MiniLM) or 384
# (mpnet) word pieces and drop the rest, but their tokeniser reads the whole text first: a page of
# megabytes took seconds and gigabytes to encode into the vector of its first words
# (bench/own_api_limits.py). Prose spends 3-6 characters a word piece, so the head holds more than
# the models read.
ENCODED_CHARS = 8192


def bounded(text: str) -> str:
    """``text`` as an encoder is given it (and its vector is named by): at most its first ``ENCODED_CHARS`` characters."""
    return text if len(text) <= ENCODED_CHARS else text[:ENCODED_CHARS]


def text_key(text: str, variant: bytes) -> bytes:
    """A text's vector's name in a store; ``variant`` names the encoder (and its int8 form): another's is never found, and the store holds no text."""
    return hashlib.blake2b(text.encode(), digest_size=16, key=variant).digest()


def unit_rows(vectors: Any) -> Any:
    """``vectors`` (one a row) scaled to length 1, as float32; a zero row stays zero."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1)


# Rows are held in half precision: a unit vector's cosines move by ~1e-4, which leaves the ranking
# as it was (bench/rounds.py: recall on the dev split), in half the memory (768 bytes a MiniLM row).
ROW_TYPE = np.float16
ROW_NAME = 100  # a row's entry in the dict that names it (its text is the request's, or the session's)


def widened(matrix: Any, rows: Any) -> Any:
    """The ``rows`` of ``matrix`` (half precision) as float32: what a product with a query's vector reads."""
    return matrix[rows].astype(np.float32)


def torch_widened(matrix: Any, rows: Any) -> Any:
    """``widened``, by torch: for a process that has it loaded (the bundled encoder), the same float32 rows
    (widening is exact) gathered and widened by vector instructions, where numpy widens half precision one
    value at a time: at a million tokens, most of a follow-up's time on the history's cosines (bench/lean.py)."""
    import torch

    return torch.from_numpy(matrix).index_select(0, torch.from_numpy(rows)).float().numpy()


class VectorCache:
    """Unit vectors by text, rows of one growing matrix: a history's thousands of
    rows come out in one gather, not one lookup and copy each.

    Rows another process encoded are known by their text's digest until a
    request names the text. When full, the older half is dropped (a history's
    texts were stored together, so they go together). Safe to share between threads.
    """

    def __init__(self, capacity: int, variant: bytes = b"", max_bytes: int = 0, gather_block: int = GATHER_BLOCK):
        """A cache of at most ``capacity`` rows (and ``max_bytes``), for the encoder ``variant`` names."""
        self.capacity = capacity
        self.max_bytes = max_bytes  # also at most as many rows as fit in this (0: rows alone), once their size is known
        self.gather_block = gather_block  # rows gathered and multiplied at once by ``cosines``
        # How rows are gathered and widened to float32 (``torch_widened`` once the bundled encoder has loaded torch).
        self.widen: Callable[[Any, Any], Any] = widened
        self.variant = variant  # names the encoder in ``text_key``: rows announced by digest are of this one
        self._rows: dict[str, int] = {}
        self._digested: dict[bytes, int] = {}  # rows announced by digest, their text not seen here yet
        self._matrix: Any = None  # allocated with the first vector, when its size is known
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many rows the cache holds."""
        return len(self._rows) + len(self._digested)

    @property
    def resident_bytes(self) -> int:
        """The matrix's bytes, and what naming its rows costs (a dict entry each; the texts are the requests')."""
        return (self._matrix.nbytes if self._matrix is not None else 0) + ROW_NAME * len(self)

    def _row(self, text: str) -> int:
        """The row of ``text`` (-1: none); one known by its digest is known by its text from now on. Lock held."""
        row = self._rows.get(text, -1)
        if row < 0 and self._digested:
            row = self._digested.pop(text_key(text, self.variant), -1)
            if row >= 0:
                self._rows[text] = row
        return row

    def found(self, texts: Sequence[str]) -> dict[str, Any]:
        """The vectors held for ``texts``, by text."""
        with self._lock:
            return {t: self._matrix[row].astype(np.float32) for t in texts if (row := self._row(t)) >= 0}

    def cosines(self, texts: Sequence[str], vector: Any) -> Any:
        """Each text's cosine with the unit ``vector`` (NaN for a text not held).

        Rows are gathered and multiplied a block at a time: a history's rows
        never become one more matrix of their own.
        """
        out = np.full(len(texts), np.nan, dtype=np.float32)
        with self._lock:
            rows = np.fromiter(map(self._rows.get, texts, repeat(-1)), dtype=np.int64, count=len(texts))  # in C: 24,000 texts at 1M tokens
            if self._digested:  # only the texts not held by name pay for a digest
                for i in np.flatnonzero(rows < 0).tolist():
                    rows[i] = self._row(texts[i])
            held = np.flatnonzero(rows >= 0)
            for block in range(0, len(held), self.gather_block):
                at = held[block : block + self.gather_block]
                out[at] = self.widen(self._matrix, rows[at]) @ vector  # the product itself is numpy's, as it always was
        return out

    def add(self, vectors: dict[str, Any]) -> None:
        """``vectors`` kept by text, those held already left as they are."""
        with self._lock:
            self._add({t: v for t, v in vectors.items() if self._row(t) < 0}, self._rows)

    def add_digested(self, vectors: dict[bytes, Any]) -> None:
        """Vectors by their text's digest (``text_key`` with this cache's variant): another process encoded them."""
        with self._lock:
            self._add({d: v for d, v in vectors.items() if d not in self._digested}, self._digested)

    def _add(self, new: dict[Any, Any], into: dict[Any, int]) -> None:
        """New rows written into the matrix and named in ``into``."""
        if not new:
            return
        if len(self) + len(new) > self.capacity:
            self._drop_older_half()
        self._make_room(len(self) + len(new), len(next(iter(new.values()))))
        start = len(self)
        self._matrix[start : start + len(new)] = np.stack(list(new.values()))
        into.update(zip(new, range(start, start + len(new))))

    def _make_room(self, rows: int, dim: int) -> None:
        """A matrix of room for ``rows`` rows of ``dim``, grown by doubling up to the capacity."""
        if self._matrix is None:
            if self.max_bytes:
                self.capacity = max(1, min(self.capacity, self.max_bytes // (dim * np.dtype(ROW_TYPE).itemsize + ROW_NAME)))
            self._matrix = np.empty((max(rows, min(1024, self.capacity)), dim), dtype=ROW_TYPE)
        elif rows > len(self._matrix):
            grown = np.empty((max(rows, min(2 * len(self._matrix), self.capacity)), dim), dtype=ROW_TYPE)
            grown[: len(self)] = self._matrix[: len(self)]
            self._matrix = grown

    def _drop_older_half(self) -> None:
        """The older half of the rows dropped, the newer moved down."""
        used = len(self)
        keep = used // 2
        cut = used - keep
        self._matrix[:keep] = self._matrix[cut:used].copy()
        self._rows = {t: row - cut for t, row in self._rows.items() if row >= cut}
        self._digested = {d: row - cut for d, row in self._digested.items() if row >= cut}
