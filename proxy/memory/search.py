"""One scope's search indexes, kept in step with the store: the Memory Router's first stage.

``ScopeIndex.open`` loads the keyword and vector indexes saved beside the
store and catches them up with what the store logged since (pages added,
rows removed); with none saved, or one that does not load, they are built
again from the store's pages and vectors. The writer thread applies every
write as it commits (``apply``) and saves now and then; requests search
under a lock held for the search alone.

Records (pages that added nothing to the scope, ``pcp_core.memory.novelty``)
have a keyword index of their own: the Memory Router's first stage never
spends a candidate on them; the API's search and a write-back's repeats read them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pcp_core.memory import index_terms

from ..storage.sealing import Sealer
from .encoding import vector_of
from .lexical import LexicalIndex
from .store import MemoryStore, Stored, Written
from .vectors import VectorIndex, faiss_available

__all__ = ["ScopeIndex"]

log = logging.getLogger("pcp.memory")

RECORDS = "records"  # the records' keyword index, under the scope's directory
SAVE_AFTER_CHANGES = 100_000
SAVE_AFTER_SECONDS = 120.0
_BATCH = 4096


class ScopeIndex:
    def __init__(self, directory: Path, lexical: LexicalIndex, vectors: VectorIndex | None, sealer: Sealer | None = None, records: LexicalIndex | None = None):
        """A scope's indexes kept in ``directory``: keywords, records apart, and vectors if any."""
        self.directory = directory
        self.sealer = sealer or Sealer()  # the store's: the keyword index's words are sealed as its pages are
        self.lexical = lexical
        self.vectors = vectors
        self.records = records or LexicalIndex()
        self.lock = threading.RLock()
        self.changes = 0  # applied since the last save
        self.saved_at = time.monotonic()
        # The store position applied: every page up to ``row`` and every removal up to ``seq`` of the scope.
        self.row = lexical.saved_row
        self.seq = lexical.saved_seq

    @classmethod
    def open(cls, store: MemoryStore, scope: str, directory: Path) -> ScopeIndex:
        """The scope's indexes as saved, caught up with the store; built from the store when not saved whole."""
        sealer = store.bodies.sealer
        lexical = LexicalIndex.load(directory, sealer)
        records = LexicalIndex.load(directory / RECORDS, sealer)
        vectors = None
        if lexical is not None and (records is None or (records.saved_row, records.saved_seq) != (lexical.saved_row, lexical.saved_seq)):
            lexical = None  # saved apart: built again
        if lexical is not None and faiss_available() and store.has_vectors(scope):
            dim = _saved_dim(directory)
            vectors = VectorIndex.load(directory, dim) if dim else None
            if vectors is None or (vectors.saved_row, vectors.saved_seq) != (lexical.saved_row, lexical.saved_seq):
                lexical, vectors = None, None  # missing, or saved apart: both built again
        if lexical is None:
            lexical, records = LexicalIndex(), None
        index = cls(directory, lexical, vectors, sealer, records)
        index.catch_up(store, scope)
        index.changes = index.changes if index.seq != lexical.saved_seq else 0
        log.debug("memory index of %s open: %d pages", scope, index.lexical.live)
        return index

    def catch_up(self, store: MemoryStore, scope: str) -> None:
        """Apply what the store logged since this index's position: pages added, rows removed (by any process)."""
        added, removed, seq = store.changes(scope, self.row, self.seq)
        with self.lock:
            if removed:
                self._remove(removed)
            for batch in _batches(added):
                self._add(batch)
                self.row = max(self.row, batch[-1].row)
                self.changes += len(batch)
            self.seq = seq
            self.changes += len(removed)

    def apply(self, written: Written) -> None:
        """A committed write: its removed rows out, its added pages in."""
        with self.lock:
            if written.removed:
                self._remove(written.removed)
            for batch in _batches(written.added):
                self._add(batch)
            self.changes += len(written.added) + len(written.removed)
            self.row = max([self.row, *(s.row for s in written.added)])
            self.seq = max(self.seq, written.seq)

    def _remove(self, rows: Sequence[int]) -> None:
        """``rows`` out of every index."""
        self.lexical.remove(rows)
        self.records.remove(rows)
        if self.vectors is not None:
            self.vectors.remove(rows)

    def _add(self, batch: Sequence[Stored]) -> None:
        """A batch of stored pages into the indexes: records apart, vectors where faiss is there."""
        for stored in batch:
            (self.records if stored.record else self.lexical).add(stored.row, index_terms(stored.page))
        with_vectors = [(s.row, s.vector) for s in batch if s.vector is not None and not s.record]
        if with_vectors and faiss_available():
            matrix = np.vstack([vector_of(vector) for _, vector in with_vectors])
            if self.vectors is None or self.vectors.dim != matrix.shape[1]:
                self.vectors = VectorIndex(matrix.shape[1])
            self.vectors.add([row for row, _ in with_vectors], matrix)

    def retrain(self, store: MemoryStore, scope: str) -> None:
        """An IVF index in place of one the scope has outgrown, trained on its vectors (the writer thread, seconds)."""
        if self.vectors is None or not self.vectors.wants_training():
            return
        rows, vectors = [], []
        added, _, _ = store.changes(scope, 0, 0)
        for stored in added:
            if stored.vector is not None:
                rows.append(stored.row)
                vectors.append(np.frombuffer(stored.vector, dtype=np.float16))
        trained = VectorIndex.trained(self.vectors.dim, rows, np.vstack(vectors).astype(np.float32))
        with self.lock:  # writes happen on this thread: nothing was added meanwhile
            self.vectors = trained
            self.changes += 1

    def save_if_due(self, row: int, seq: int, force: bool = False) -> None:
        """Save both indexes as of the store's (``row``, ``seq``) when enough changed, or enough time passed.

        With a shared store, the index's own position (``row``, ``seq``): other processes write between.
        """
        due = self.changes >= SAVE_AFTER_CHANGES or (self.changes and time.monotonic() - self.saved_at > SAVE_AFTER_SECONDS)
        if not (due or (force and self.changes)):
            return
        with self.lock:
            self.lexical.save(self.directory, row, seq, self.sealer)
            self.records.save(self.directory / RECORDS, row, seq, self.sealer)
            if self.vectors is not None:
                self.vectors.save(self.directory, row, seq)
            self.changes, self.saved_at = 0, time.monotonic()

    # -- searching (any thread) --------------------------------------------------------------
    def broad_match(self, weights: Mapping[str, float], vector: Any, limit: int) -> dict[int, tuple[float, float]]:
        """The rows the keyword and the vector index bring for a query, with their lexical score and cosine (NaN: not scored)."""
        found: dict[int, tuple[float, float]] = {}
        with self.lock:
            rows, scores = self.lexical.search(weights, limit)
            for row, score in zip(rows.tolist(), scores.tolist()):
                found[row] = (score, float("nan"))
            if vector is not None and self.vectors is not None and self.vectors.dim == len(vector):
                rows, cosines = self.vectors.search(vector, limit)
                for row, cosine in zip(rows.tolist(), cosines.tolist()):
                    found[row] = (found.get(row, (0.0, 0.0))[0], cosine)
        return found

    def records_match(self, weights: Mapping[str, float], limit: int) -> dict[int, tuple[float, float]]:
        """The records the keyword index of records brings for a query (the API's search)."""
        with self.lock:
            rows, scores = self.records.search(weights, limit)
        return {row: (score, float("nan")) for row, score in zip(rows.tolist(), scores.tolist())}

    def alike(self, terms: Iterable[str], limit: int) -> list[int]:
        """The pages, records too, that share most of ``terms`` (the best ``limit`` of each index): what a new page is weighed against."""
        weights = dict.fromkeys(terms, 1.0)
        with self.lock:
            found = [*self.lexical.search(weights, limit)[0].tolist(), *self.records.search(weights, limit)[0].tolist()]
        return list(dict.fromkeys(int(row) for row in found))

    def frequencies(self) -> tuple[Mapping[str, int], int]:
        """Each stemmed term's document frequency among the pages that inform, and their number (what novelty weighs terms by)."""
        with self.lock:
            return _Frequencies(self.lexical), self.lexical.live

    def containing(self, terms: list[str]) -> list[int]:
        """The rows of pages (and records) that contain all of ``terms``."""
        with self.lock:
            return [int(row) for row in (*self.lexical.containing(terms), *self.records.containing(terms))]

    @property
    def size(self) -> int:
        """How many pages the keyword index holds."""
        return self.lexical.live


class _Frequencies(Mapping[str, int]):
    """A keyword index's document frequencies, read by term (a live view: read it under the index's lock, or accept a write's drift)."""

    def __init__(self, lexical: LexicalIndex):
        """Document frequencies read from ``lexical``."""
        self.lexical = lexical

    def __getitem__(self, term: str) -> int:
        """How many pages hold ``term``."""
        tid = self.lexical.vocab[term]
        return int(self.lexical.df[tid])

    def __iter__(self) -> Iterator[str]:
        """The indexed terms."""
        return iter(self.lexical.vocab)

    def __len__(self) -> int:
        """How many terms are indexed."""
        return len(self.lexical.vocab)


def _saved_dim(directory: Path) -> int:
    """The vector dimension an index in ``directory`` was saved with, 0 if none."""
    import json

    try:
        return int(json.loads((directory / "vectors.json").read_text())["dim"])
    except (OSError, ValueError, KeyError):
        return 0


def _batches(items: Iterable[Stored]) -> Iterable[list[Stored]]:
    """``items`` in lists of at most ``_BATCH``."""
    batch: list[Stored] = []
    for item in items:
        batch.append(item)
        if len(batch) >= _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
