"""The Router-MMU (§VI.1–2): anchor the intent, then address pages by it.

Broad match scores the pages: BM25, which needs no model and is the floor
every deployment has, plus dense recall when the host embeds.
Precision selection by a router model can be layered on by the host.
"""

from __future__ import annotations

import re
import threading
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

import msgspec
import numpy as np

from .consolidator import terms
from .pages import Page, without_turn_markers
from .session import common_prefix
from .timeline import Period, mentioned_periods, moment
from .tokens import CountText, prompt_tokens

__all__ = ["Bm25", "Intent", "anchor_intent", "broad_match", "dense_scores", "dense_texts", "lexical_scores", "page_ranking", "precision_selection", "router_prompt", "said_in", "stem", "unit_texts"]

# Below this many content terms a query says too little to address by (§VI.1 "continue").
LOW_ENTROPY_TERMS = 2
HEAD_WEIGHT = 0.25
# Pseudo-relevance feedback: terms of the best pages join the query, lightly.
FEEDBACK_PAGES = 3
FEEDBACK_TERMS = 20
FEEDBACK_WEIGHT = 0.2
# A page's score gains this share of its better neighbour's (see "broad match over pages").
NEIGHBOUR_SHARE = 0.3
# The lexical share of a page's score when dense scores are there too.
LEXICAL_WEIGHT = 0.5
# A page said in a period the query names gains this much (in standard deviations of
# the pages' scores); so does one said up to REPORT_GRACE after, as events are told of later.
TIME_WEIGHT = 1.0
REPORT_GRACE = timedelta(days=14)


class Intent(msgspec.Struct, frozen=True):
    """The Intent Focus: weighted terms from the tail (the query) and, lightly, the head; and the times the tail names."""

    text: str
    weights: dict[str, float]
    borrowed: bool = False  # the query was too thin and borrowed the previous summary
    periods: tuple[Period, ...] = ()


def anchor_intent(head: str, tail: str, previous: str = "", now: datetime | None = None) -> Intent:
    """``now`` (naive UTC) lets the tail's times be read: "on 8 May, 2023", "in June", "yesterday"."""
    weights: dict[str, float] = {}
    for term in terms(head):
        weights[term] = max(weights.get(term, 0.0), HEAD_WEIGHT)
    tail_terms = set(terms(tail))
    borrowed = len(tail_terms) < LOW_ENTROPY_TERMS and bool(previous)
    if borrowed:
        for term in terms(previous):
            weights[term] = max(weights.get(term, 0.0), 0.6)
    for term in tail_terms:
        weights[term] = 1.0
    text = f"{tail}\n{previous}" if borrowed else tail
    periods = tuple(mentioned_periods(tail, now)) if now is not None else ()
    return Intent(text=text, weights=weights, borrowed=borrowed, periods=periods)


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


class Bm25:
    """Okapi BM25 (k1=1.2, b=0.75) over pages, or over any texts (``Bm25.of_texts``).

    A page's keywords count twice, as index keys should. Vectorised: every
    (document, term) pair is one entry of flat arrays sorted by the term's
    hash, so a query reads only its own terms' entries (a few binary
    searches), whatever the length of the conversation. Each text's terms are
    computed once and cached, and ``of_texts`` starts from the recent index
    that shares the longest prefix with its texts, cut back to that prefix,
    rather than build it again: a follow-up reopens the conversation's last
    page and adds a few turns after it, in a conversation of thousands.
    """

    def __init__(self, pages: Iterable[Page], k1: float = 1.2, b: float = 0.75):
        pages = list(pages)
        self.k1, self.b = k1, b
        self._build([p.id for p in pages], [_doc_terms(p.content or p.summary, p.keywords) for p in pages])

    @classmethod
    def of_texts(cls, texts: Sequence[str], k1: float = 1.2, b: float = 0.75) -> Bm25:
        """BM25 over ``texts``, whose ids are their positions ("0", "1", …)."""
        texts = tuple(texts)
        with _RECENT_LOCK:
            recent = [s for s in _RECENT if (s.k1, s.b) == (k1, b)]
        shared, prefix = max(((common_prefix(s.texts, texts), s) for s in recent), key=lambda pair: pair[0], default=(0, None))
        search = cls.__new__(cls)
        search.k1, search.b = k1, b
        if prefix is None or not shared:
            search._build([str(i) for i in range(len(texts))], [_doc_terms(t, ()) for t in texts])
        else:
            search._extend(prefix._cut(shared), [_doc_terms(t, ()) for t in texts[shared:]])
        search.texts = texts
        with _RECENT_LOCK:
            _RECENT.append(search)
        return search

    def _build(self, ids: list[str], docs: list[_DocTerms]) -> None:
        self.ids, self.docs = ids, docs
        hashes = np.concatenate([d.hashes for d in docs]) if docs else np.zeros(0, dtype=np.int64)
        order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[order]
        self.tf = (np.concatenate([d.counts for d in docs]) if docs else np.zeros(0))[order]
        self.doc_of = np.repeat(np.arange(len(docs)), [len(d.hashes) for d in docs])[order]
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
            self.doc_of = np.insert(prefix.doc_of, at, np.repeat(np.arange(n, n + len(docs)), [len(d.hashes) for d in docs])[order])
        else:
            self.hashes, self.tf, self.doc_of = prefix.hashes, prefix.tf, prefix.doc_of
        self._lengths(np.concatenate([prefix.lengths, np.array([d.length for d in docs], dtype=np.float64)]))

    def _lengths(self, lengths: Any) -> None:
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


# The indexes ``Bm25.of_texts`` built last, one per recent conversation: a
# follow-up's turns extend one of them. Requests run on worker threads.
_RECENT: deque[Bm25] = deque(maxlen=8)
_RECENT_LOCK = threading.Lock()


class _DocTerms(NamedTuple):
    """One document's distinct stemmed terms, their hashes and counts, and its length in terms."""

    terms: tuple[str, ...]
    hashes: Any
    counts: Any
    length: int


def _stemmed(weights: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for term, weight in weights.items():
        key = stem(term)
        out[key] = max(out.get(key, 0.0), weight)
    return out


def _ranked(scores: dict[str, float], limit: int | None) -> list[tuple[str, float]]:
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])
    return ranked[:limit] if limit else ranked


@lru_cache(maxsize=131072)
def _doc_terms(text: str, keywords: tuple[str, ...]) -> _DocTerms:
    """The stemmed terms of a page or a turn; cached, since a session's pages are indexed on every request.

    The "[assistant]" markers of the page layout are not words anyone said.
    """
    counts = Counter(stem(t) for t in terms(without_turn_markers(text)))
    counts.update(stem(k) for keyword in keywords for k in terms(keyword))
    distinct = tuple(counts)
    return _DocTerms(
        terms=distinct,
        hashes=np.array([hash(t) for t in distinct], dtype=np.int64),
        counts=np.array([counts[t] for t in distinct], dtype=np.float64),
        length=sum(counts.values()),
    )


# -- broad match over pages (§VI.2.1) ---------------------------------------------------
#
# The unit is the page: its text (turns without their markers, or a file's
# lines). Lexical (BM25 with feedback) and dense (MiniLM cosine) scores are put
# on one scale (z-scores over the conversation's pages) and added; a page then
# gains a share of its better neighbour's score, since evidence comes in
# exchanges that a page boundary can cut (a question and its answer, a story
# and its date). Scoring each turn and ranking a page by its best turn recalled
# less: on the LoCoMo dev split, round 0 at 2,048 tokens held all the evidence
# of 0.73 of questions that way against 0.76 by pages (BM25), 0.77 against
# 0.79 with MiniLM (bench/recall.py) — a page of a few turns is a passage, and
# its turns tell together what one turn alone does not.


def unit_texts(pages: Sequence[Page]) -> list[str]:
    """What broad match scores, one per page: its text without the "[role]" turn markers."""
    return [_said(page.content) for page in pages]


@lru_cache(maxsize=65536)
def _said(content: str) -> str:
    """Cached: a session's pages come back on every request."""
    return without_turn_markers(content)


def dense_texts(units: Sequence[str]) -> list[str]:
    """What dense recall embeds: each unit alone, then each unit read with the one before it.

    The start of a page often answers the end of the one before ("Yes, last
    May!"); read together they say what it is about. A unit scores by the
    better of its two readings.
    """
    return [*units, *(_read_with(units[i - 1], unit) if i else unit for i, unit in enumerate(units))]


@lru_cache(maxsize=65536)
def _read_with(previous: str, unit: str) -> str:
    """A unit read after the one before it; cached, so a follow-up gets the very same strings (and their hashes) again."""
    return f"{previous}\n{unit}"


def dense_scores(cosines: Any, n: int) -> Any:
    """Per-unit dense scores from the intent's cosines with ``dense_texts`` of ``n`` units.

    A NaN is a text not embedded yet: its reading scores 0, the mean.
    """
    cosines = np.asarray(cosines, dtype=np.float64)
    return np.maximum(_z(cosines[:n]), _z(cosines[n : 2 * n]))


def lexical_scores(intent: Intent, texts: Sequence[str]) -> Any:
    """Each of ``texts`` (pages' ``unit_texts``) scored for ``intent`` by BM25 with feedback."""
    return Bm25.of_texts(texts).feedback_scores(intent.weights)


def broad_match(intent: Intent, pages: Sequence[Page], lexical: Any, dense: Any = None) -> list[str]:
    """``pages`` ranked for ``intent``, best first (``lexical``: their ``lexical_scores``).

    Each page scores by BM25 with feedback, plus ``dense`` scores when the
    host embeds, plus the lift of being said when the intent asks about.
    """
    timely = said_in([page.timestamp for page in pages], intent.periods) if intent.periods else None
    return page_ranking([page.id for page in pages], lexical, dense, timely)


def said_in(timestamps: Sequence[str], periods: Sequence[Period], grace: timedelta = REPORT_GRACE) -> Any:
    """For each page (by its timestamp), whether it was said in one of ``periods``, or within ``grace`` after.

    None when the query names no period, or no page was said in one: then time
    tells the pages nothing apart.
    """
    if not periods:
        return None
    verdicts: dict[str, bool] = {}  # many pages share a timestamp (a session's date)
    for timestamp in timestamps:
        if timestamp not in verdicts:
            when = moment(timestamp)
            verdicts[timestamp] = when is not None and any(p.holds(when, grace) for p in periods)
    inside = np.array([verdicts[t] for t in timestamps], dtype=bool)
    return inside if inside.any() else None


def page_ranking(ids: Sequence[str], lexical: Sequence[float], dense: Any = None, timely: Any = None, lexical_weight: float = LEXICAL_WEIGHT, neighbour_share: float = NEIGHBOUR_SHARE) -> list[str]:
    """The pages ``ids`` (in conversation order, page ``i`` scored ``lexical[i]``) best first.

    ``timely`` (from ``said_in``) marks the pages said when the query asks
    about; they gain ``TIME_WEIGHT``. Without dense scores, only pages that
    share a term with the query, or are timely, or stand beside one, are
    ranked: the others carry no signal at all. Ties keep conversation order.
    """
    if not ids:
        return []
    lexical = np.asarray(lexical, dtype=np.float64)
    score = _z(lexical)
    if dense is not None:
        score = lexical_weight * score + (1 - lexical_weight) * np.asarray(dense, dtype=np.float64)
    signal = np.ones(len(score), dtype=bool) if dense is not None else lexical > 0
    if timely is not None:
        score = score + TIME_WEIGHT * timely
        signal = signal | timely
    if neighbour_share and len(score) > 1:
        score = score + neighbour_share * _beside(score, score.min())
        signal = signal | _beside(signal, False)
    return [ids[i] for i in np.argsort(-score, kind="stable") if signal[i]]


def _beside(values: Any, edge: Any) -> Any:
    """For each position, the greater of its two neighbours' values (``edge`` past the ends)."""
    padded = np.pad(values, 1, constant_values=edge)
    return np.maximum(padded[:-2], padded[2:])


def _z(values: Any) -> Any:
    """Values on a common scale: mean 0, standard deviation 1 (all 0 when they do not vary)."""
    values = np.asarray(values, dtype=np.float64)
    known = values[~np.isnan(values)]
    spread = known.std() if len(known) else 0.0
    if not spread > 0:
        return np.zeros_like(values)
    return np.nan_to_num((values - known.mean()) / spread, nan=0.0)


# -- precision selection by a router model (§VI.2) -----------------------------------

ROUTER_CANDIDATES = 12  # the best-ranked pages a router model reads
ROUTER_INSTRUCTIONS = (
    "You address the pages of a long conversation. Each line below is one page: its id, "
    "its date and its summary. Reply with the ids of the pages most likely to hold what "
    "answers the question, most useful first, separated by commas, and nothing else. "
    "Leave out pages that do not help."
)
_WORD_TOKEN = re.compile(r"\w+")  # page ids are short hex hashes


def router_prompt(intent: Intent, candidates: Sequence[Page], budget: int, count: CountText) -> list[dict[str, str]]:
    """Chat messages asking a router model to pick among ``candidates``, within ``budget`` tokens.

    The model compares the intent with page summaries, as §VI.2 has it; the
    worst-ranked candidates are left out until the prompt fits.
    """
    lines = [f"[{page.id}] {page.timestamp[:10]} {page.summary}" for page in candidates]
    while True:
        messages = [
            {"role": "system", "content": ROUTER_INSTRUCTIONS},
            {"role": "user", "content": f"Question: {intent.text}\n\nPages:\n" + "\n".join(lines)},
        ]
        if not lines or prompt_tokens(messages, count) <= budget:
            return messages
        lines.pop()


def precision_selection(ranked: Sequence[str], reply: str, candidates: Sequence[str]) -> list[str]:
    """``ranked`` with the candidates the router model chose first, in its order.

    Ids it names that were not candidates are ignored, so a model that invents
    or misspells ids changes nothing; the rest keep the broad match's order.
    """
    allowed = set(candidates)
    chosen = dict.fromkeys(t for t in _WORD_TOKEN.findall(reply) if t in allowed)
    return [*chosen, *(page_id for page_id in ranked if page_id not in chosen)]
