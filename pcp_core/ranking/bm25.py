"""BM25 over pages or texts, vectorised, and what a host keeps of it between requests.

Okapi BM25 is the floor of the Router's broad match: it needs no model. A
conversation comes back whole on every request, so what BM25 computed of its
texts is worth keeping; ``Bm25Cache`` keeps it, one per host, bounded.
"""

from __future__ import annotations

import sys
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from ..pages.logical import Page, without_turn_markers
from ..session import common_prefix
from ..text.terms import terms

__all__ = ["Bm25", "Bm25Cache", "stem", "stems"]

# Pseudo-relevance feedback: terms of the best pages join the query, lightly.
FEEDBACK_PAGES = 3
FEEDBACK_TERMS = 20
FEEDBACK_WEIGHT = 0.2
# Each text's terms, for as many texts as a few long conversations hold.
CACHED_TEXTS = 65536
# The indexes built last, one per recent conversation: a follow-up's texts extend one of them.
CACHED_INDEXES = 8


class Bm25Cache:
    """What BM25 computed that conversations send again: each text's terms, and the recent indexes.

    One per host, created with it and passed to every request. Bounded: past
    ``texts`` entries, or half of ``max_bytes`` (0: no such bound), the older
    half of the texts' terms is dropped; past ``indexes`` indexes, or what
    ``max_bytes`` leaves them beside the terms, the oldest goes (the newest
    stays, whatever its size). An index extended into a new one is dropped for
    it: a conversation keeps one, not one per follow-up. Shared by the host's
    threads without a lock: each use is one dict or deque operation, and a race
    lost costs a text's terms computed twice, never a wrong answer.
    """

    def __init__(self, texts: int = CACHED_TEXTS, indexes: int = CACHED_INDEXES, max_bytes: int = 0):
        self.size = texts
        self.max_bytes = max_bytes
        self._terms: dict[str, _DocTerms] = {}
        self.terms_bytes = 0  # what the texts' terms hold, estimated (``_held_bytes``)
        self._indexes: deque[Bm25] = deque(maxlen=indexes)

    def terms(self, text: str) -> _DocTerms:
        """The terms of ``text``, kept for the next request."""
        found = self._terms.get(text)
        if found is None:
            found = _doc_terms(text)
            if self.size:
                if len(self._terms) >= self.size or (self.max_bytes and self.terms_bytes > self.max_bytes // 2):
                    self._drop_older_half()
                self._terms[text] = found
                self.terms_bytes += _held_bytes(text, found)
        return found

    def _drop_older_half(self) -> None:
        """Forget the older half of the texts' terms."""
        held = list(self._terms.items())  # one call: atomic under the interpreter lock
        self._terms = dict(held[len(held) // 2 :])
        self.terms_bytes = sum(_held_bytes(text, found) for text, found in held[len(held) // 2 :])

    def recent(self) -> list[Bm25]:
        """The indexes kept, oldest first."""
        return list(self._indexes)

    def keep(self, index: Bm25, replacing: Bm25 | None = None) -> None:
        """Keep ``index`` for the requests after this one; ``replacing``: the index it extends, which it stands for now."""
        if not self._indexes.maxlen:
            return
        if replacing is not None:
            try:
                self._indexes.remove(replacing)
            except ValueError:  # dropped meanwhile
                pass
        self._indexes.append(index)
        while self.max_bytes and len(self._indexes) > 1 and self.indexes_bytes > self.max_bytes - self.terms_bytes:
            self._indexes.popleft()

    @property
    def indexes_bytes(self) -> int:
        """What the kept indexes hold: their arrays, and a document's id and entry each (its terms are the texts' cache's)."""
        return sum(index.resident_bytes for index in list(self._indexes))

    @property
    def resident_bytes(self) -> int:
        """What the kept indexes and the texts' terms hold."""
        return self.indexes_bytes + self.terms_bytes

    def __len__(self) -> int:
        return len(self._terms)


_SUFFIXES = ("ations", "ation", "ings", "ing", "edly", "ed", "ies", "es", "ers", "er", "ly", "s")


@lru_cache(maxsize=65536)
def stem(term: str) -> str:
    """A light suffix stripper: "adopting", "adopted", "adopts" all address "adopt"."""
    if term[:1].isdigit():
        return term
    for suffix in _SUFFIXES:
        if term.endswith(suffix) and len(term) - len(suffix) >= 3:
            term = term[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    if len(term) > 3 and term[-1] == term[-2] and term[-1] not in "lsz":
        term = term[:-1]  # "planned" -> "plann" -> "plan"
    return term.removesuffix("e") if len(term) > 4 else term


def stems(texts: Sequence[str]) -> list[str]:
    """The stems of the terms of ``texts``, in order: what an index is asked for them."""
    return [stem(t) for text in texts for t in terms(text)]


class Bm25:
    """Okapi BM25 (k1=1.2, b=0.75) over pages, or over any texts (``Bm25.of_texts``).

    A page's keywords count twice, as index keys should. Vectorised: every
    (document, term) pair is one entry of flat arrays sorted by the term's
    hash, so a query reads only its own terms' entries (a few binary
    searches), whatever the length of the conversation. With a ``Bm25Cache``,
    each text's terms are computed once, and ``of_texts`` starts from the recent index
    that shares the longest prefix with its texts, cut back to that prefix,
    rather than build it again: a follow-up reopens the conversation's last
    page and adds a few turns after it, in a conversation of thousands.
    """

    texts: tuple[str, ...]  # an index of ``of_texts`` only: what it was built over

    def __init__(self, pages: Iterable[Page], k1: float = 1.2, b: float = 0.75):
        pages = list(pages)
        self.k1, self.b = k1, b
        self._build([p.id for p in pages], [_doc_terms(p.content or p.summary, p.keywords) for p in pages])

    @classmethod
    def of_texts(cls, texts: Sequence[str], cache: Bm25Cache | None = None, k1: float = 1.2, b: float = 0.75) -> Bm25:
        """BM25 over ``texts``, whose ids are their positions ("0", "1", …).

        With a ``cache``, each text's terms are computed once, and the index
        starts from the recent one that shares the longest prefix with ``texts``.
        """
        cache = Bm25Cache(texts=0, indexes=0) if cache is None else cache
        texts = tuple(texts)
        recent = [s for s in cache.recent() if (s.k1, s.b) == (k1, b)]
        shared, prefix = max(((common_prefix(s.texts, texts), s) for s in recent), key=lambda pair: pair[0], default=(0, None))
        search = cls.__new__(cls)
        search.k1, search.b = k1, b
        if prefix is None or not shared:
            search._build([str(i) for i in range(len(texts))], [cache.terms(t) for t in texts])
        else:
            search._extend(prefix._cut(shared), [cache.terms(t) for t in texts[shared:]])
        search.texts = texts
        # The index it extends whole is superseded by it; one it cut short (an edit, a fork) is another branch's.
        cache.keep(search, replacing=prefix if prefix is not None and shared == prefix.n else None)
        return search

    @property
    def resident_bytes(self) -> int:
        """Its arrays' bytes, and ~120 bytes a document for its id and the slots that list it."""
        return self.hashes.nbytes + self.tf.nbytes + self.doc_of.nbytes + self.lengths.nbytes + self.norm.nbytes + 120 * self.n

    def _build(self, ids: list[str], docs: list[_DocTerms]) -> None:
        """Index ``docs`` under ``ids``: their term hashes sorted, for lookups by term."""
        self.ids, self.docs = ids, docs
        hashes = np.concatenate([d.hashes for d in docs]) if docs else np.zeros(0, dtype=np.int64)
        order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[order]
        self.tf = (np.concatenate([d.counts for d in docs]) if docs else np.zeros(0, dtype=np.float32))[order]
        self.doc_of = np.repeat(np.arange(len(docs), dtype=np.int32), [len(d.hashes) for d in docs])[order]
        self._lengths(np.array([d.length for d in docs], dtype=np.float64))

    def _cut(self, n: int) -> Bm25:
        """This index of the first ``n`` documents only (filtering keeps the arrays sorted)."""
        if n == self.n:
            return self
        cut = Bm25.__new__(Bm25)
        cut.k1, cut.b = self.k1, self.b
        cut.ids, cut.docs, cut.texts = self.ids[:n], self.docs[:n], self.texts[:n]
        kept = self.doc_of < n
        cut.hashes, cut.tf, cut.doc_of = self.hashes[kept], self.tf[kept], self.doc_of[kept]
        cut._lengths(self.lengths[:n])
        return cut

    def _extend(self, prefix: Bm25, docs: list[_DocTerms]) -> None:
        """``prefix``'s index with ``docs`` after its own: their entries merged into the sorted arrays."""
        n = prefix.n
        self.ids = [*prefix.ids, *(str(n + i) for i in range(len(docs)))]
        self.docs = [*prefix.docs, *docs]
        if docs:
            hashes = np.concatenate([d.hashes for d in docs])
            order = np.argsort(hashes, kind="stable")
            at = np.searchsorted(prefix.hashes, hashes[order], side="right")  # after equal keys: documents stay in order
            self.hashes = np.insert(prefix.hashes, at, hashes[order])
            self.tf = np.insert(prefix.tf, at, np.concatenate([d.counts for d in docs])[order])
            self.doc_of = np.insert(prefix.doc_of, at, np.repeat(np.arange(n, n + len(docs), dtype=np.int32), [len(d.hashes) for d in docs])[order])
        else:
            self.hashes, self.tf, self.doc_of = prefix.hashes, prefix.tf, prefix.doc_of
        self._lengths(np.concatenate([prefix.lengths, np.array([d.length for d in docs], dtype=np.float64)]))

    def _lengths(self, lengths: Any) -> None:
        """Set the documents' lengths and BM25's length normalisation."""
        self.n = len(lengths)
        self.lengths = lengths
        average = lengths.mean() if self.n else 1.0
        self.norm = self.k1 * (1 - self.b + self.b * lengths / (average or 1.0))  # per document

    def _match(self, hashes: Any) -> tuple[Any, Any, Any]:
        """For distinct term ``hashes``: the term of each matching entry, the entries, and each term's idf.

        A term's entries are one run of the sorted arrays; each document lists
        a term once, so the run's length is the term's document frequency.
        """
        left = np.searchsorted(self.hashes, hashes, side="left")
        df = np.searchsorted(self.hashes, hashes, side="right") - left
        term = np.repeat(np.arange(len(hashes)), df)
        entries = np.arange(len(term)) + np.repeat(left - (np.cumsum(df) - df), df)  # each run, laid end to end
        return term, entries, np.log(1 + (self.n - df + 0.5) / (df + 0.5))

    def _scores(self, weights: Mapping[str, float]) -> Any:
        """BM25 of every document, in order, for weights over stemmed terms."""
        if not weights or not self.n:
            return np.zeros(self.n)
        keys, wanted = np.array([hash(t) for t in weights], dtype=np.int64), np.array(list(weights.values()))
        term, entries, idf = self._match(keys)
        doc, tf = self.doc_of[entries], self.tf[entries]
        contribution = wanted[term] * idf[term] * tf * (self.k1 + 1) / (tf + self.norm[doc])
        return np.bincount(doc, weights=contribution, minlength=self.n)

    def scores(self, weights: Mapping[str, float]) -> dict[str, float]:
        """Documents with a positive score, by id."""
        return self._positive(self._scores(_stemmed(weights)))

    def rank(self, weights: Mapping[str, float], limit: int | None = None) -> list[tuple[str, float]]:
        """The documents best first for ``weights``, at most ``limit`` of them."""
        return _ranked(self.scores(weights), limit)

    def rank_with_feedback(self, weights: Mapping[str, float], pages: int = FEEDBACK_PAGES, terms: int = FEEDBACK_TERMS) -> list[tuple[str, float]]:
        """Pseudo-relevance feedback (RM3-style): the query, plus the most telling terms of its best documents.

        A question and its evidence often share few words ("identity" against
        "transgender"); the documents the question does match best tend to speak
        of the same things in the evidence's words.
        """
        return _ranked(self._positive(self.feedback_scores(weights, pages, terms)), None)

    def _positive(self, scores: Any) -> dict[str, float]:
        """The documents with a positive score, by id."""
        return {self.ids[i]: float(scores[i]) for i in np.flatnonzero(scores > 0)}

    def feedback_scores(self, weights: Mapping[str, float], pages: int = FEEDBACK_PAGES, terms: int = FEEDBACK_TERMS) -> Any:
        """``rank_with_feedback`` as one score per document, in document order (0 where nothing matched)."""
        query = _stemmed(weights)
        first = self._scores(query)
        best = [i for i in np.argsort(-first, kind="stable")[:pages] if first[i] > 0]
        if not best:
            return first
        keys = np.unique(np.concatenate([self.docs[i].hashes for i in best]))
        idf = dict(zip(keys.tolist(), self._match(keys)[2].tolist()))
        telling: Counter[str] = Counter()
        for i in best:
            doc = self.docs[i]
            for term, key, count in zip(doc.terms, doc.hashes.tolist(), doc.counts.tolist()):
                telling[term] += count * idf[key]
        expanded = dict(query)
        for term, _ in telling.most_common(terms):
            expanded.setdefault(term, FEEDBACK_WEIGHT)
        return self._scores(expanded)


class _DocTerms(NamedTuple):
    """One document's distinct stemmed terms, their hashes and counts, and its length in terms."""

    terms: tuple[str, ...]
    hashes: Any
    counts: Any
    length: int


def _stemmed(weights: Mapping[str, float]) -> dict[str, float]:
    """``weights`` by stemmed term, the highest weight of each stem."""
    out: dict[str, float] = {}
    for term, weight in weights.items():
        key = stem(term)
        out[key] = max(out.get(key, 0.0), weight)
    return out


def _ranked(scores: dict[str, float], limit: int | None) -> list[tuple[str, float]]:
    """``scores`` best first, at most ``limit`` of them."""
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    return ranked[:limit] if limit else ranked


# What a text's terms cost in ``Bm25Cache`` beyond the text and a term each: the tuple, the two arrays, the entry.
HELD_TERMS = 400


def _held_bytes(text: str, found: _DocTerms) -> int:
    """About what ``Bm25Cache`` holds for a text: the text (it keeps it alive), its terms' tuple slots and arrays."""
    return sys.getsizeof(text) + HELD_TERMS + 20 * len(found.terms)


def _doc_terms(text: str, keywords: tuple[str, ...] = ()) -> _DocTerms:
    """The stemmed terms of a page or a turn (``Bm25Cache`` keeps them: a session's pages are indexed on every request).

    The "[assistant]" markers of the page layout are not words anyone wrote.
    """
    counts = Counter(map(stem, terms(without_turn_markers(text))))
    if keywords:
        counts.update(stem(k) for keyword in keywords for k in terms(keyword))
    distinct = tuple(counts)
    return _DocTerms(
        terms=distinct,
        hashes=np.fromiter(map(hash, distinct), dtype=np.int64, count=len(distinct)),
        counts=np.fromiter(counts.values(), dtype=np.float32, count=len(distinct)),  # whole numbers, exact: half the bytes of float64
        length=sum(counts.values()),
    )
