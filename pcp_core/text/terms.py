"""Terms: the content words of a text, and how distinctive each is among a set of texts.

§2.4 wants summaries and keywords to keep the anchors (names, numbers, dates,
identifiers), so terms are weighed by inverse document frequency over the
pages being built, and anchors weigh more: a name that appears everywhere in a
conversation ranks below one that appears once.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from functools import lru_cache

__all__ = ["STOPWORDS", "TF", "TermStats", "TermWeights", "consensus_keywords", "terms", "top_keywords", "words_of"]

# Common English function words; they carry no addressing signal.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are aren as at be because been before being below
    between both but by can could couldn did didn do does doesn doing don down during each few for from further
    had hadn has hasn have haven having he her here hers herself him himself his how i if in into is isn it its
    itself just let ll me more most my myself no nor not now of off on once only or other our ours ourselves out
    over own re same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was wasn we were weren what when where which while who whom
    why will with won would you your yours yourself yourselves also really yeah yes oh hey hi thanks thank
    okay ok got get gets going go gonna like just lot lots much many well sure way thing things one ve
    know think feel good great love glad awesome wow cool nice amazing something anything everything""".split()
)

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'.\-/:]*[A-Za-z0-9]|[A-Za-z0-9]")
MONTHS = frozenset("january february march april may june july august september october november december".split())

TermWeights = dict[str, float]


def words_of(text: str) -> tuple[str, ...]:
    """Lower-cased content words of ``text``, possessives dropped (``terms``, not cached)."""
    return tuple(filter(None, map(_term, _WORD.findall(text))))


# Per word as written: a conversation says its words again and again (a million tokens' history is some
# 4.5 million words of a few tens of thousands), and paging reads each page's words several times.
@lru_cache(maxsize=1 << 17)
def _normal(word: str) -> str:
    """A word as terms are compared: lower case, without a possessive or the punctuation around it."""
    return word.lower().removesuffix("'s").strip(".'-/:")


@lru_cache(maxsize=1 << 17)
def _term(word: str) -> str | None:
    """The term a word as written is, or None: a stopword, a lone letter, a contraction (i'd, you've carry nothing to address by)."""
    word = _normal(word)
    if "'" in word:
        return None
    return word if len(word) > 1 and word not in STOPWORDS or word.isdigit() else None


# Cached: a page's text is read by paging, the summary and the Router alike. Texts read
# once (a summary's candidate sentences) go to ``words_of``: in the cache they would push
# out the pages, and a long history's paging would read every page's terms anew each time.
terms = lru_cache(maxsize=65536)(words_of)


@lru_cache(maxsize=1 << 17)
def _boost(term: str, capital: bool) -> float:
    """Names, numbers, dates and identifiers weigh more (§2.4 anchors); ``capital``: the term as written opens with one."""
    if any(ch.isdigit() for ch in term) or term in MONTHS:
        return 2.0
    if capital or any(ch in term for ch in "_./-"):
        return 1.5
    return 1.0


class TermStats:
    """Document frequencies over a set of texts (the pages being built)."""

    def __init__(self, documents: Sequence[str]):
        self.n = max(len(documents), 1)
        df: Counter[str] = Counter()
        for doc in documents:
            df.update(set(terms(doc)))
        self.df: Mapping[str, int] = df
        self.idfs = _Idfs(self.n, df)

    @classmethod
    def from_counts(cls, n: int, df: Mapping[str, int]) -> TermStats:
        """Stats over ``df``, the counts of ``n`` documents (read, not copied: they must not change while the stats are read)."""
        stats = cls(())
        stats.n, stats.df = max(n, 1), df
        stats.idfs = _Idfs(stats.n, df)
        return stats

    def idf(self, term: str) -> float:
        """The inverse document frequency of ``term``."""
        return self.idfs[term]

    def weights(self, text: str) -> TermWeights:
        """tf·idf·anchor weight of each term of ``text``."""
        written = _WORD.findall(text)
        originals = dict(zip(map(_normal, written), written))  # each term as last written
        counts = Counter(terms(text))
        idfs = self.idfs
        return {t: TF[c] * idfs[t] * _boost(t, originals.get(t, t)[:1].isupper()) for t, c in counts.items()}


class _Tf(dict[int, float]):
    """``1 + log(count)``, the weight of a term found ``count`` times, worked out once a count."""

    def __missing__(self, count: int) -> float:
        self[count] = value = 1 + math.log(count)
        return value


TF = _Tf()


class _Idfs(dict[str, float]):
    """Each term's idf, worked out the first time it is asked for: paging a million tokens' history
    asks ~900,000 times, for a few thousand terms (the summaries' weights, the topics' overlaps)."""

    def __init__(self, n: int, df: Mapping[str, int]):
        super().__init__()
        self.n, self.df = n, df

    def __missing__(self, term: str) -> float:
        n, df = self.n, self.df.get(term, 0)
        self[term] = value = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return value


_CLOCK = re.compile(r"^\d{1,2}:\d{2}$")


def top_keywords(weights: TermWeights, k: int) -> tuple[str, ...]:
    """The ``k`` terms of highest weight (a time of day never among them)."""
    # A time of day says when, not what: it addresses nothing on its own (and opens with a digit).
    ranked = heapq.nsmallest(k, [(-w, t) for t, w in weights.items() if not (t[:1].isdigit() and _CLOCK.match(t))])
    return tuple(t for _, t in ranked)


def consensus_keywords(children: Sequence[Sequence[str]], k: int) -> tuple[str, ...]:
    """Keywords shared by the most children first (§5.1.2), then by rank within a child."""
    score: defaultdict[str, float] = defaultdict(float)
    for keywords in children:
        for rank, keyword in enumerate(keywords):
            score[keyword] += 1.0 + 1.0 / (rank + 2)
    return tuple(t for t, _ in sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))[:k])
