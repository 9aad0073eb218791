"""The Consolidator's model-free half (§VI.5, §2.4): segmentation, keywords, extractive summaries.

§2.4 forbids literary summaries: a summary must keep the anchors — names,
numbers, dates, identifiers. So summaries here are *chosen sentences*, ranked by
how many distinctive terms they carry, and keywords favour exactly those anchors.
Distinctiveness is inverse document frequency over the pages being built, so a
name that appears everywhere in a conversation ranks below one that appears once.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache

from .pages import ConsolidatedPage, Page, short_hash, without_turn_markers

__all__ = [
    "Segmenter",
    "TermStats",
    "consolidate",
    "consensus_keywords",
    "extractive_summary",
    "model_summary",
    "segment_turns",
    "summary_prompt",
    "terms",
]

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
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
MONTHS = frozenset("january february march april may june july august september october november december".split())

TermWeights = dict[str, float]


@lru_cache(maxsize=65536)
def terms(text: str) -> tuple[str, ...]:
    """Lower-cased content words of ``text``, possessives dropped.

    Cached: a page's text is read by paging, the summary and the Router alike.
    """
    out = []
    for word in _WORD.findall(text):
        word = word.lower().removesuffix("'s").strip(".'-/:")
        if "'" in word:  # contractions (i'd, you've) carry nothing to address by
            continue
        if len(word) > 1 and word not in STOPWORDS or word.isdigit():
            out.append(word)
    return tuple(out)


def _anchor_boost(term: str, original: str) -> float:
    """Names, numbers, dates and identifiers weigh more (§2.4 anchors)."""
    if any(ch.isdigit() for ch in term) or term in MONTHS:
        return 2.0
    if original[:1].isupper() or any(ch in term for ch in "_./-"):
        return 1.5
    return 1.0


class TermStats:
    """Document frequencies over a set of texts (the pages being built)."""

    def __init__(self, documents: Sequence[str]):
        self.n = max(len(documents), 1)
        self.df: Counter[str] = Counter()
        for doc in documents:
            self.df.update(set(terms(doc)))

    @classmethod
    def from_counts(cls, n: int, df: Mapping[str, int]) -> TermStats:
        """Stats the caller keeps up to date itself: ``df`` over ``n`` documents (read, not copied)."""
        stats = cls(())
        stats.n, stats.df = max(n, 1), df  # type: ignore[assignment]
        return stats

    def idf(self, term: str) -> float:
        return math.log(1 + (self.n - self.df.get(term, 0) + 0.5) / (self.df.get(term, 0) + 0.5))

    def weights(self, text: str) -> TermWeights:
        """tf·idf·anchor weight of each term of ``text``."""
        originals = {w.lower().removesuffix("'s").strip(".'-/:"): w for w in _WORD.findall(text)}
        counts = Counter(terms(text))
        return {t: (1 + math.log(c)) * self.idf(t) * _anchor_boost(t, originals.get(t, t)) for t, c in counts.items()}


_CLOCK = re.compile(r"^\d{1,2}:\d{2}$")


def top_keywords(weights: TermWeights, k: int) -> tuple[str, ...]:
    # A time of day says when, not what: it addresses nothing on its own.
    ranked = sorted(((t, w) for t, w in weights.items() if not _CLOCK.match(t)), key=lambda kv: (-kv[1], kv[0]))
    return tuple(t for t, _ in ranked[:k])


def extractive_summary(text: str, weights: TermWeights, max_chars: int) -> str:
    """The sentences carrying the most weight, in their original order, within ``max_chars``.

    Each sentence keeps its speaker ("Caroline: …"): who said it is an anchor too.
    """
    sentences = _attributed_sentences(text)
    if not sentences:
        return ""
    scored = sorted(
        range(len(sentences)),
        key=lambda i: -sum(weights.get(t, 0.0) for t in set(terms(sentences[i]))) / math.sqrt(len(sentences[i]) + 20),
    )
    chosen: list[int] = []
    used = 0
    for i in scored:
        if used + len(sentences[i]) + 1 <= max_chars:
            chosen.append(i)
            used += len(sentences[i]) + 1
    if not chosen:  # even the best sentence is too long: cut it at a word boundary
        return _clip(sentences[scored[0]], max_chars)
    return " ".join(sentences[i] for i in sorted(chosen))


_SPEAKER = re.compile(r"^([A-Z][\w .'-]{0,30}):(?:\s+|$)")


def _attributed_sentences(text: str) -> list[str]:
    """The sentences of ``text``, each with its speaker.

    A sentence that names its own speaker keeps it (a summary's line holds
    several speakers), one that does not takes the line's; a speaker with
    nothing after it is no sentence.
    """
    out = []
    for line in without_turn_markers(text).splitlines():
        line = line.strip()
        speaker = _SPEAKER.match(line)
        prefix = speaker.group(0) if speaker else ""
        for sentence in _SENTENCE.split(line):
            sentence = sentence.strip()
            own = _SPEAKER.match(sentence)
            if own:
                prefix, sentence = own.group(0), sentence[own.end() :].strip()
            if sentence:
                out.append(prefix + sentence)
    return out


def consensus_keywords(children: Sequence[Sequence[str]], k: int) -> tuple[str, ...]:
    """Keywords shared by the most children first (§5.1.2), then by rank within a child."""
    score: Counter[str] = Counter()
    for keywords in children:
        for rank, keyword in enumerate(keywords):
            score[keyword] += 1.0 + 1.0 / (rank + 2)
    return tuple(t for t, _ in sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))[:k])


def consolidate(children: Sequence[Page], stats: TermStats, keywords: int, summary_chars: int) -> ConsolidatedPage:
    """The container of ``children`` (§5.1.2): their consensus keywords, and a summary chosen from theirs."""
    consensus = consensus_keywords([c.keywords for c in children], keywords)
    full_text = "\n".join(c.summary for c in children)
    # The sentences that say the most of what is distinctive here, the consensus keywords above all.
    weights = stats.weights(full_text)
    for i, keyword in enumerate(consensus):
        weights[keyword] = weights.get(keyword, 0.0) + float(len(consensus) - i)
    return ConsolidatedPage(
        id=short_hash("Consolidated", *(c.id for c in children)),
        origin=children[0].origin,
        depth=0,
        timestamp=children[0].timestamp,
        keywords=consensus,
        summary=extractive_summary(full_text, weights, summary_chars),
        source_ids=tuple(c.id for c in children),
        content=full_text,
        first_turn=children[0].first_turn,
        last_turn=children[-1].last_turn,
    )


def _clip(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1].rsplit(" ", 1)[0]
    return cut + "…"


# -- segmentation ----------------------------------------------------------------

Segmenter = Callable[[Sequence[int]], list[range]]


def segment_turns(token_counts: Sequence[int], max_tokens: int, max_turns: int) -> list[range]:
    """Consecutive groups of turns bounded in tokens and turns (the physical trigger, §VI.5).

    A turn larger than ``max_tokens`` gets a group of its own; the caller splits it.
    Topic pivots are the smarter trigger and can be layered on as a Segmenter.
    """
    groups: list[range] = []
    start, used = 0, 0
    for i, tokens in enumerate(token_counts):
        if i > start and (used + tokens > max_tokens or i - start >= max_turns):
            groups.append(range(start, i))
            start, used = i, 0
        used += tokens
    if start < len(token_counts):
        groups.append(range(start, len(token_counts)))
    return groups


# -- summaries by a model (PCP_CONSOLIDATOR=llm) ---------------------------------------

SUMMARY_INSTRUCTIONS = (
    "You index pages of a conversation. Compress the page into one dense line of at most {words} words: "
    "who did, decided or said what. Keep every name, number, date, time, place, quantity and identifier "
    "exactly as written (semantic entropy compression). No commentary, no preamble, no literary phrasing."
)
SUMMARY_WORDS = 40


def summary_prompt(text: str, words: int = SUMMARY_WORDS) -> list[dict[str, str]]:
    """The messages that ask a model for a page's summary."""
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS.format(words=words)},
        {"role": "user", "content": without_turn_markers(text)},
    ]


def model_summary(reply: str, max_chars: int) -> str | None:
    """The summary a model wrote, on one line and within ``max_chars``; None if it wrote nothing usable."""
    line = " ".join(reply.split())
    for preamble in ("Summary:", "Here is the summary:", "Here's the summary:"):
        line = line.removeprefix(preamble).strip()
    return _clip(line, max_chars) if len(terms(line)) >= 2 else None
