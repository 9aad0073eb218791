"""The vector index of one memory scope (faiss): exact while small, IVF-PQ past ``EXACT_UP_TO`` vectors.

Pages are addressed by their store row (faiss ids). A small scope is searched
exactly (inner product of normalised vectors: the cosine). A large one is an
inverted file of product-quantised codes, trained on the scope's own
vectors: ~1/16 of the memory of the vectors themselves, and a query scans
``NPROBE`` of ``nlist`` lists, so a million pages answer in about a
millisecond. Its scores are approximate; the Memory Router reads each
candidate's exact cosine from the store before it ranks them (``service``).

Saved beside the store with the (row, seq) it reflects, as the keyword index is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["VectorIndex", "faiss_available"]

EXACT_UP_TO = 50_000
RETRAIN_GROWTH = 8  # an IVF index is trained again from the store once the scope has grown this many times over
NPROBE = 24
ADD_BATCH = 512  # vectors held before they are added: faiss adds a batch for about what it adds one for


def _faiss() -> Any:
    """faiss, on one thread: its work here comes in small pieces (a write's few vectors, one query), where
    OpenMP's threads cost more than they give, and spin on cores the proxy shares with its requests."""
    import faiss

    faiss.omp_set_num_threads(1)
    return faiss


def faiss_available() -> bool:
    """Whether faiss is installed."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


class VectorIndex:
    def __init__(self, dim: int):
        """An exact inner-product index of ``dim``-dimensional vectors."""
        faiss = _faiss()
        self.dim = dim
        self.index: Any = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self.trained_on = 0  # vectors the IVF index was trained on (0: exact)
        self.saved_row = 0
        self.saved_seq = 0
        self.pending: list[tuple[Any, Any]] = []  # (rows, vectors) not added yet

    def __len__(self) -> int:
        """How many vectors the index holds, the pending ones added first."""
        self.flush()
        return int(self.index.ntotal)

    def flush(self) -> None:
        """Add the vectors held back; every read and every removal flushes first."""
        if self.pending:
            rows = np.concatenate([np.asarray(r, dtype=np.int64) for r, _ in self.pending])
            vectors = np.ascontiguousarray(np.vstack([v for _, v in self.pending]), dtype=np.float32)
            self.pending = []
            self.index.add_with_ids(vectors, rows)

    @property
    def exact(self) -> bool:
        """Whether the index is exact (not trained as IVF)."""
        return self.trained_on == 0

    def add(self, rows: Any, vectors: Any) -> None:
        """Vectors queued for the index, added in batches."""
        if len(rows):
            self.pending.append((rows, vectors))
            if sum(len(r) for r, _ in self.pending) >= ADD_BATCH:
                self.flush()

    def remove(self, rows: Any) -> None:
        """``rows`` out of the index."""
        if len(rows):
            self.flush()
            self.index.remove_ids(_faiss().IDSelectorBatch(np.asarray(rows, dtype=np.int64)))

    def search(self, vector: Any, k: int) -> tuple[Any, Any]:
        """The rows of the ``k`` nearest vectors and their (approximate) cosines."""
        if not len(self):  # (flushes what is held back)
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        scores, rows = self.index.search(np.asarray(vector, dtype=np.float32).reshape(1, -1), min(k, len(self)))
        keep = rows[0] >= 0
        return rows[0][keep], scores[0][keep].astype(np.float64)

    def wants_training(self) -> bool:
        """Whether the scope has outgrown its index: exact past ``EXACT_UP_TO``, IVF past ``RETRAIN_GROWTH`` times its training."""
        n = len(self)
        return n > EXACT_UP_TO if self.exact else n > RETRAIN_GROWTH * self.trained_on

    @classmethod
    def trained(cls, dim: int, rows: Any, vectors: Any, seed: int = 0) -> VectorIndex:
        """An IVF-PQ index over ``vectors`` (at ``rows``), trained on a sample of them."""
        faiss = _faiss()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        n = len(vectors)
        # About as many lists as vectors per list; trained on 32 vectors a list (faiss wants 39 for a
        # warning-free k-means, and 32 are plenty for lists scanned 24 at a time).
        nlist = int(min(max(256, np.sqrt(n)), 4096))
        codes = next(m for m in (dim // 8, dim // 12, dim // 16, 8, 4, 2, 1) if m and dim % m == 0)
        index = faiss.index_factory(dim, f"IVF{nlist},PQ{codes}", faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(seed).choice(n, size=min(n, 40 * nlist), replace=False)
        index.train(vectors[np.sort(sample)])
        index.nprobe = NPROBE
        index.add_with_ids(vectors, np.asarray(rows, dtype=np.int64))
        made = cls.__new__(cls)
        made.dim, made.index, made.trained_on = dim, index, n
        made.saved_row = made.saved_seq = 0
        made.pending = []
        return made

    # -- on disk ---------------------------------------------------------------------------
    def save(self, directory: Path, row: int, seq: int) -> None:
        """The index saved under ``directory``, stamped with the watermark it holds."""
        faiss = _faiss()
        self.flush()
        directory.mkdir(parents=True, exist_ok=True)
        stamp = f"{row}-{seq}"
        faiss.write_index(self.index, str(directory / f"vectors-{stamp}.faiss"))
        record = {"row": row, "seq": seq, "stamp": stamp, "dim": self.dim, "trained_on": self.trained_on}
        tmp = directory / "vectors.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, directory / "vectors.json")
        for old in directory.glob("vectors-*.faiss"):
            if stamp not in old.name:
                old.unlink(missing_ok=True)
        self.saved_row, self.saved_seq = row, seq

    @classmethod
    def load(cls, directory: Path, dim: int) -> VectorIndex | None:
        """The index saved in ``directory`` for vectors of ``dim``, or None (none, or another model's)."""
        faiss = _faiss()
        try:
            record = json.loads((directory / "vectors.json").read_text())
            if record["dim"] != dim:
                return None
            index = faiss.read_index(str(directory / f"vectors-{record['stamp']}.faiss"))
        except (OSError, ValueError, KeyError, RuntimeError):
            return None
        made = cls.__new__(cls)
        made.dim, made.index, made.trained_on = dim, index, int(record["trained_on"])
        made.pending = []
        if made.trained_on:
            faiss.extract_index_ivf(index).nprobe = NPROBE
        made.saved_row, made.saved_seq = int(record["row"]), int(record["seq"])
        return made
