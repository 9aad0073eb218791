"""Page summaries (§VI.5, §2.4): chosen sentences, never literary prose; and the prompt that asks a model for one.

§2.4 forbids literary summaries: a summary must keep the anchors — names,
numbers, dates, identifiers. So summaries here are *chosen sentences*, ranked by
how many distinctive terms they carry (``pcp_core.text.terms.TermStats``). A container's
summary is chosen from its children's, around their consensus keywords.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from itertools import repeat

from ..text.terms import TermStats, TermWeights, consensus_keywords, terms, words_of
from .logical import ConsolidatedPage, Page, short_hash, without_turn_markers

__all__ = ["consolidate", "extractive_summary", "model_summary", "summary_prompt"]

# A sentence ends at . ! or ?, but not at an initial ("George R. R. Martin" is one name, not three sentences).
_SENTENCE = re.compile(r"(?<=[.!?])(?<!\b[A-Z]\.)\s+|\n+")


def extractive_summary(text: str, weights: TermWeights, max_chars: int) -> str:
    """The sentences carrying the most weight, in their original order, within ``max_chars``.

    Each sentence keeps its speaker ("Caroline: …"): its speaker is an anchor too.
    """
    sentences = _attributed_sentences(text)
    if not sentences:
        return ""
    # Only a sentence that fits may be chosen: the others are scored only when none does.
    fitting = [i for i, sentence in enumerate(sentences) if len(sentence) + 1 <= max_chars]
    if not fitting:  # even the best sentence is too long: cut it at a word boundary
        return _clip(sentences[_best_first(sentences, range(len(sentences)), weights)[0]], max_chars)
    chosen: list[int] = []
    kept: set[str] = set()
    used = 0
    for i in _best_first(sentences, fitting, weights):
        if used + len(sentences[i]) + 1 > max_chars:
            continue
        same = _gist(sentences[i])
        if same in kept:  # a sentence twice (two pages alike, "Thanks!" and "Thanks.") is summarised once
            continue
        chosen.append(i)
        kept.add(same)
        used += len(sentences[i]) + 1
    return " ".join(sentences[i] for i in sorted(chosen))


def _best_first(sentences: Sequence[str], among: Sequence[int], weights: TermWeights) -> list[int]:
    """The sentences ``among`` (by place), the most weight for their length first; ties in their order."""
    weight = weights.get
    # Each term once, in the order the sentence says them: a set would sum in the order of the process's string
    # hashes, and two processes could choose different sentences at a near tie.
    score = {i: -sum(map(weight, dict.fromkeys(words_of(sentences[i])), _NONE)) / math.sqrt(len(sentences[i]) + 20) for i in among}
    return sorted(among, key=score.__getitem__)


_NONE = repeat(0.0)  # the weight of a term that has none


def _gist(sentence: str) -> str:
    """What a sentence says, whatever its case and closing punctuation."""
    return sentence.rstrip(".!?").lower()


# A speaker is a name: up to four capitalised words ("Caroline", "Jean-Luc Picard", "Dr. Ruth Smith"),
# a dot only after an initial or a title. "Yes. One important thing:" is a sentence and a label, not a
# speaker: taken for one, it opened every sentence of its line, its own first one twice.
_SPEAKER = re.compile(r"^((?:[A-Z][a-z]{0,3}\. )?[A-Z][\w'-]*(?: (?:[A-Z]\. )?[A-Z][\w'-]*){0,3}):(?:\s+|$)")


def _attributed_sentences(text: str) -> list[str]:
    """The sentences of ``text``, each with its speaker.

    A sentence that names its own speaker keeps it (a summary's line holds
    several speakers), one that does not takes the line's; a speaker with
    nothing after it is no sentence.
    """
    out = []
    for line in without_turn_markers(text).splitlines():
        line = line.strip()
        speaker = _SPEAKER.match(line) if ":" in line else None  # (a speaker ends in one)
        prefix = speaker.group(0) if speaker else ""
        for sentence in _SENTENCE.split(line):
            sentence = sentence.strip()
            own = _SPEAKER.match(sentence) if ":" in sentence else None
            if own:
                prefix, sentence = own.group(0), sentence[own.end() :].strip()
            if sentence:
                out.append(prefix + sentence)
    return out


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
    """``text`` cut at a word to at most ``max_chars``."""
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1].rsplit(" ", 1)[0]
    return cut + "…"


# -- summaries by a model (PCP_SUMMARIES=llm) ---------------------------------------

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
