"""The Router-MMU (§VI.1–2): anchor the intent, then address pages by it.

Broad match scores the pages: BM25, which needs no model and is the floor
every deployment has, plus dense recall when the host embeds.
Precision selection by a router model can be layered on by the host.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from ..pages.logical import Page, without_turn_markers
from ..text.terms import terms
from ..text.timeline import Period, mentioned_periods, moment
from ..text.tokens import CountText, prompt_tokens
from .bm25 import Bm25, Bm25Cache

__all__ = [
    "Intent",
    "anchor_intent",
    "broad_match",
    "broad_scores",
    "dense_scores",
    "dense_texts",
    "lexical_scores",
    "page_ranking",
    "page_scores",
    "precision_selection",
    "router_prompt",
    "dated_in",
    "text_memos",
    "unit_texts",
]

# Below this many content terms a query says too little to address by (§VI.1 "continue").
LOW_ENTROPY_TERMS = 2
HEAD_WEIGHT = 0.25
# A page's score gains this share of its better neighbour's (see "broad match over pages").
NEIGHBOUR_SHARE = 0.3
# The lexical share of a page's score when dense scores are there too.
LEXICAL_WEIGHT = 0.5
# A page dated in a period the query names gains this much (in standard deviations of
# the pages' scores); so does one dated up to REPORT_GRACE after, as events are reported later.
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


# -- broad match over pages (§VI.2.1) ---------------------------------------------------
#
# The unit is the page: its text (turns without their markers, or a file's
# lines). Lexical (BM25 with feedback) and dense (MiniLM cosine) scores are put
# on one scale (z-scores over the conversation's pages) and added; a page then
# gains a share of its better neighbour's score, since evidence comes in
# exchanges that a page boundary can cut (a question and its answer, a story
# and its date). Scoring each turn and ranking a page by its best turn recalled
# less on the LoCoMo dev split, with BM25 and with MiniLM (bench/recall.py):
# a page of a few turns is a passage, and its turns tell together what one
# turn alone does not.


def unit_texts(pages: Sequence[Page]) -> list[str]:
    """What broad match scores, one per page: its text without the "[role]" turn markers."""
    return list(map(_unit_text, map(_CONTENT, pages)))  # in C: a million tokens' history is some 12,000 pages


_CONTENT = attrgetter("content")


@lru_cache(maxsize=65536)
def _unit_text(content: str) -> str:
    """Cached: a session's pages come back on every request."""
    return without_turn_markers(content)


def text_memos() -> dict[str, Any]:
    """The caches keyed by pages' texts (each an ``lru_cache``, process-wide: a session's pages come back on every
    request), by what they hold: a host that bounds its memory forgets them (``cache_clear``) as its sessions leave it."""
    return {"units": _unit_text, "readings": _read_with, "terms": terms}


def dense_texts(units: Sequence[str]) -> list[str]:
    """What dense recall embeds: each unit alone, then each unit read with the one before it.

    The start of a page often answers the end of the one before ("Yes, last
    May!"); read together they say what it is about. A unit scores by the
    better of its two readings.
    """
    return [*units, *units[:1], *map(_read_with, units[:-1], units[1:])]  # the first unit has none before it


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


def lexical_scores(intent: Intent, texts: Sequence[str], cache: Bm25Cache | None = None) -> Any:
    """Each of ``texts`` (pages' ``unit_texts``) scored for ``intent`` by BM25 with feedback."""
    return Bm25.of_texts(texts, cache).feedback_scores(intent.weights)


def broad_match(intent: Intent, pages: Sequence[Page], lexical: Any, dense: Any = None) -> list[str]:
    """``pages`` ranked for ``intent``, best first (``lexical``: their ``lexical_scores``).

    Each page scores by BM25 with feedback, plus ``dense`` scores when the
    host embeds, plus the lift of being dated when the intent asks about.
    """
    return _ordered([page.id for page in pages], *broad_scores(intent, pages, lexical, dense))


def broad_scores(intent: Intent, pages: Sequence[Page], lexical: Any, dense: Any = None) -> tuple[Any, Any]:
    """What ``broad_match`` ranks ``pages`` by: their ``page_scores``, timely where the intent names a period."""
    timely = dated_in([page.timestamp for page in pages], intent.periods) if intent.periods else None
    return page_scores(lexical, dense, timely)


def dated_in(timestamps: Sequence[str], periods: Sequence[Period], grace: timedelta = REPORT_GRACE) -> Any:
    """For each page (by its timestamp), whether it is dated in one of ``periods``, or within ``grace`` after.

    None when the query names no period, or no page is dated in one: then time
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


def page_ranking(
    ids: Sequence[str],
    lexical: Sequence[float],
    dense: Any = None,
    timely: Any = None,
    lexical_weight: float = LEXICAL_WEIGHT,
    neighbour_share: float = NEIGHBOUR_SHARE,
) -> list[str]:
    """The pages ``ids`` (in conversation order, page ``i`` scored ``lexical[i]``) best first.

    ``timely`` (from ``dated_in``) marks the pages dated when the query asks
    about; they gain ``TIME_WEIGHT``. Without dense scores, only pages that
    share a term with the query, or are timely, or stand beside one, are
    ranked: the others carry no signal at all. Ties keep conversation order.
    """
    return _ordered(ids, *page_scores(lexical, dense, timely, lexical_weight, neighbour_share))


def _ordered(ids: Sequence[str], score: Any, signal: Any) -> list[str]:
    """``ids`` by ``score``, best first, those without a ``signal`` left out; ties keep conversation order."""
    if not ids:
        return []
    order = np.argsort(-score, kind="stable")
    return list(map(ids.__getitem__, order[signal[order]].tolist()))  # in C: a million tokens' history is some 12,000 pages


def page_scores(
    lexical: Sequence[float],
    dense: Any = None,
    timely: Any = None,
    lexical_weight: float = LEXICAL_WEIGHT,
    neighbour_share: float = NEIGHBOUR_SHARE,
) -> tuple[Any, Any]:
    """Each page's score, in standard deviations of the conversation's (``page_ranking`` orders by it), and whether
    anything in the query speaks for it at all."""
    lexical_array = np.asarray(lexical, dtype=np.float64)
    score = _z(lexical_array)
    if dense is not None:
        score = lexical_weight * score + (1 - lexical_weight) * np.asarray(dense, dtype=np.float64)
    signal = np.ones(len(score), dtype=bool) if dense is not None else lexical_array > 0
    if timely is not None:
        score = score + TIME_WEIGHT * timely
        signal = signal | timely
    if neighbour_share and len(score) > 1:
        score = score + neighbour_share * _beside(score, score.min())
        signal = signal | _beside(signal, False)
    return score, signal


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
