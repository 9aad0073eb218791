"""The keyword index of one memory scope: BM25 over pages' keywords and summaries, fast at a million pages.

Postings are numpy arrays in segments (CSR by term id), each term's postings
ordered by their BM25 term-frequency part, best first. A query reads at most
``CAP`` postings of a term per segment: the pages where a term weighs most.
That bounds a query's cost whatever the scope's size, and costs nothing
where it matters — past the first thousands of postings a common term
cannot lift a page into the best few hundred. New pages go to a small
in-memory segment first, sealed into an array segment every ``DELTA_DOCS``;
segments are merged when there are too many. Documents are numbered locally
(in row order), and a removed one is marked dead.

Saved as files beside the store (``save``/``load``), with the store's
(row, seq) it reflects; the caller catches up from there.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..storage.sealing import Sealer

__all__ = ["LexicalIndex"]

K1, B = 1.2, 0.75
CAP = 4096  # postings read per term per segment
DELTA_DOCS = 8192  # pages held in the in-memory segment before it is sealed
MAX_SEGMENTS = 8
_VOCAB = "memory-vocabulary"  # the sealed vocabulary's associated data


class _Segment(msgspec.Struct):
    offsets: Any  # int64, one more than the terms it knows: term t's postings are [offsets[t], offsets[t+1])
    docs: Any  # int32 local document numbers
    impacts: Any  # float16 BM25 term-frequency part
    name: str = ""  # its files' name once saved

    @classmethod
    def load(cls, directory: Path, name: str) -> _Segment:
        """The segment saved as ``name`` in ``directory``, its arrays memory-mapped."""
        offsets, docs, impacts = (np.load(directory / f"{name}.{field}.npy", mmap_mode="r") for field in ("offsets", "docs", "impacts"))
        return cls(offsets, docs, impacts, name=name)


class LexicalIndex:
    def __init__(self) -> None:
        """An empty index."""
        self.vocab: dict[str, int] = {}
        self.df = np.zeros(0, dtype=np.int32)
        self.rows = np.zeros(0, dtype=np.int64)  # local number -> store row, ascending
        self.lengths = np.zeros(0, dtype=np.float32)
        self.alive = np.zeros(0, dtype=bool)
        self.n = 0  # documents, dead ones included
        self.live = 0
        self.total_length = 0.0  # of live documents
        self.segments: list[_Segment] = []
        self.delta: dict[int, tuple[list[int], list[float]]] = {}  # term id -> (docs, term frequencies)
        self.delta_docs = 0
        self.doc_terms: dict[int, list[int]] = {}  # delta docs' terms, to undo their df if removed
        self.saved_row = 0
        self.saved_seq = 0

    # -- adding and removing ---------------------------------------------------------------
    def add(self, row: int, counts: Mapping[str, int]) -> None:
        """A page (its ``row`` above every row added before), with its terms' counts."""
        local = self.n
        self._grow(local + 1)
        self.rows[local], self.alive[local] = row, True
        length = float(sum(counts.values()))
        self.lengths[local] = length
        self.n += 1
        self.live += 1
        self.total_length += length
        tids = []
        for term, count in counts.items():
            tid = self.vocab.setdefault(term, len(self.vocab))
            if tid >= len(self.df):
                self.df = np.concatenate([self.df, np.zeros(max(1024, len(self.df)), dtype=np.int32)])
            self.df[tid] += 1
            docs, tfs = self.delta.setdefault(tid, ([], []))
            docs.append(local)
            tfs.append(float(count))
            tids.append(tid)
        self.doc_terms[local] = tids
        self.delta_docs += 1
        if self.delta_docs >= DELTA_DOCS:
            self.seal()

    def remove(self, rows: Any) -> None:
        """Mark the documents at store ``rows`` dead (rows the index never held are ignored)."""
        rows = np.asarray(rows, dtype=np.int64)
        at = np.searchsorted(self.rows[: self.n], rows)
        for local, row in zip(at.tolist(), rows.tolist()):
            if local < self.n and self.rows[local] == row and self.alive[local]:
                self.alive[local] = False
                self.live -= 1
                self.total_length -= float(self.lengths[local])
                # A sealed document's terms are not looked up (a scan of every segment): its terms keep
                # counting in their document frequencies, a slightly lower idf, until the index is built again.
                for tid in self.doc_terms.pop(local, ()):
                    self.df[tid] -= 1

    def _grow(self, size: int) -> None:
        """Room for ``size`` documents, grown by doubling."""
        if size > len(self.rows):
            grown = max(size, 2 * len(self.rows), 1024)
            self.rows = np.resize(self.rows, grown)
            self.lengths = np.resize(self.lengths, grown)
            self.alive = np.concatenate([self.alive, np.zeros(grown - len(self.alive), dtype=bool)])

    def seal(self) -> None:
        """The in-memory segment as an array segment, each term's postings best first; merge when there are too many."""
        if not self.delta:
            return
        tids = np.concatenate([np.full(len(d), t, dtype=np.int64) for t, (d, _) in self.delta.items()])
        docs = np.concatenate([np.asarray(d, dtype=np.int32) for d, _ in self.delta.values()])
        tfs = np.concatenate([np.asarray(f, dtype=np.float32) for _, f in self.delta.values()])
        self.segments.append(self._segment(tids, docs, tfs))
        self.delta, self.delta_docs, self.doc_terms = {}, 0, {}
        if len(self.segments) > MAX_SEGMENTS:
            self._merge()

    def _segment(self, tids: Any, docs: Any, tfs: Any) -> _Segment:
        """A posting segment of these terms and documents, each posting's BM25 impact precomputed."""
        average = self.total_length / self.live if self.live else 1.0
        impacts = tfs * (K1 + 1) / (tfs + K1 * (1 - B + B * self.lengths[docs] / (average or 1.0)))
        order = np.lexsort((-impacts, tids))
        offsets = np.zeros(len(self.vocab) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(np.bincount(tids, minlength=len(self.vocab)))
        return _Segment(offsets=offsets, docs=docs[order], impacts=impacts[order].astype(np.float16))

    def _merge(self) -> None:
        """The smaller half of the segments as one (their dead postings dropped)."""
        ranked = sorted(range(len(self.segments)), key=lambda i: len(self.segments[i].docs))
        chosen = set(ranked[: len(ranked) // 2 + 1])
        parts = [self.segments[i] for i in sorted(chosen)]
        tids = np.concatenate([np.repeat(np.arange(len(s.offsets) - 1), np.diff(s.offsets)) for s in parts])
        docs = np.concatenate([s.docs for s in parts])
        impacts = np.concatenate([s.impacts.astype(np.float32) for s in parts])
        keep = self.alive[docs]
        tids, docs, impacts = tids[keep], docs[keep], impacts[keep]
        order = np.lexsort((-impacts, tids))
        offsets = np.zeros(len(self.vocab) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(np.bincount(tids, minlength=len(self.vocab)))
        merged = _Segment(offsets=offsets, docs=docs[order], impacts=impacts[order].astype(np.float16))
        self.segments = [s for i, s in enumerate(self.segments) if i not in chosen] + [merged]

    # -- searching ---------------------------------------------------------------------
    def search(self, weights: Mapping[str, float], limit: int) -> tuple[Any, Any]:
        """The store rows of the best ``limit`` live documents for the stemmed term ``weights``, and their scores."""
        if not self.live or not weights:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        scores = np.zeros(self.n, dtype=np.float32)
        touched = False
        average = self.total_length / self.live
        for term, weight in weights.items():
            tid = self.vocab.get(term)
            if tid is None or not self.df[tid]:
                continue
            idf = weight * math.log(1 + (self.live - self.df[tid] + 0.5) / (self.df[tid] + 0.5))
            for segment in self.segments:
                if tid + 1 < len(segment.offsets):
                    start = segment.offsets[tid]
                    end = min(segment.offsets[tid + 1], start + CAP)
                    docs = segment.docs[start:end]
                    scores[docs] += idf * segment.impacts[start:end]  # a term lists a document once
                    touched = True
            if tid in self.delta:
                docs_list, tfs_list = self.delta[tid]
                docs, tfs = np.asarray(docs_list), np.asarray(tfs_list, dtype=np.float32)
                scores[docs] += idf * tfs * (K1 + 1) / (tfs + K1 * (1 - B + B * self.lengths[docs] / average))
                touched = True
        if not touched:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        # The documents a term touched, found by one pass over the scores (no sort of the postings read).
        hits = np.flatnonzero(scores)
        hits = hits[self.alive[hits]]
        found = scores[hits]
        if len(hits) > limit:
            best = np.argpartition(-found, limit)[:limit]
            hits, found = hits[best], found[best]
        order = np.argsort(-found, kind="stable")
        return self.rows[hits[order]], found[order].astype(np.float64)

    def containing(self, terms: list[str]) -> Any:
        """Store rows of the live documents holding every one of ``terms`` (all postings read)."""
        found: Any = None
        for term in terms:
            tid = self.vocab.get(term)
            if tid is None:
                return np.zeros(0, dtype=np.int64)
            parts = [s.docs[s.offsets[tid] : s.offsets[tid + 1]] for s in self.segments if tid + 1 < len(s.offsets)]
            parts.append(np.asarray(self.delta.get(tid, ([], []))[0], dtype=np.int32))
            docs = np.unique(np.concatenate(parts))
            found = docs if found is None else np.intersect1d(found, docs)
        if found is None:
            return np.zeros(0, dtype=np.int64)
        return self.rows[found[self.alive[found]]]

    # -- on disk ---------------------------------------------------------------------------
    def save(self, directory: Path, row: int, seq: int, sealer: Sealer | None = None) -> None:
        """Write the index as of the store's (``row``, ``seq``); then the record that names its files, atomically.

        A segment never changes once sealed: it is written once, under a name
        of its own, and read back memory-mapped. Each save writes the new
        segments and the small per-document arrays.
        """
        self.seal()
        directory.mkdir(parents=True, exist_ok=True)
        for segment in self.segments:
            if not segment.name:
                segment.name = f"segment-{uuid.uuid4().hex[:12]}"
                for field in ("offsets", "docs", "impacts"):
                    np.save(directory / f"{segment.name}.{field}.npy", getattr(segment, field))
        stamp = f"{row}-{seq}"
        np.savez(directory / f"documents-{stamp}.npz", df=self.df, rows=self.rows[: self.n], lengths=self.lengths[: self.n], alive=self.alive[: self.n])
        # The words of pages' keywords and summaries: sealed with PCP_DATA_KEY, as the pages are.
        (directory / f"vocab-{stamp}.json").write_bytes((sealer or Sealer()).seal(json.dumps(list(self.vocab)).encode(), _VOCAB))
        segments = [s.name for s in self.segments]
        record = {"row": row, "seq": seq, "stamp": stamp, "segments": segments, "live": self.live, "total_length": self.total_length}
        tmp = directory / "lexical.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, directory / "lexical.json")
        kept = {stamp, *segments}
        for old in directory.glob("*.*"):
            if old.name.startswith(("documents-", "vocab-", "segment-")) and not any(k in old.name for k in kept):
                old.unlink(missing_ok=True)
        self.saved_row, self.saved_seq = row, seq

    @classmethod
    def load(cls, directory: Path, sealer: Sealer | None = None) -> LexicalIndex | None:
        """The index saved in ``directory`` (its segments memory-mapped), or None when there is none whole (or its words do not open)."""
        try:
            record = json.loads((directory / "lexical.json").read_text())
            stamp = record["stamp"]
            arrays = np.load(directory / f"documents-{stamp}.npz")
            words = (sealer or Sealer()).open((directory / f"vocab-{stamp}.json").read_bytes(), _VOCAB)
            if words is None:
                return None
            vocab = json.loads(words)
            index = cls()
            index.vocab = {term: i for i, term in enumerate(vocab)}
            index.df = arrays["df"].copy()
            index.rows, index.lengths, index.alive = arrays["rows"].copy(), arrays["lengths"].copy(), arrays["alive"].copy()
            index.n = len(index.rows)
            index.live, index.total_length = int(record["live"]), float(record["total_length"])
            index.segments = [_Segment.load(directory, name) for name in record["segments"]]
            index.saved_row, index.saved_seq = int(record["row"]), int(record["seq"])
            return index
        except (OSError, ValueError, KeyError):
            return None
