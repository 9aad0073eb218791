"""What a write-back adds to its scope: pages that inform, records that do not, pages that only ask, as rules.

Every request of a scope is written back, and a question asked in a new
conversation becomes a page of its own (its answer never comes back). Such a
page shares the words of the questions asked after it, and would outrank the
turns that hold their answers. Three rules keep what informs, by content:

* **novelty** — each turn of a new page (its speaker aside: a question, an
  answer, a remark) is weighed against the scope's pages most like the page
  (the host's keyword matches, the conversation's own pages aside): the share
  of its terms' weight (idf in the scope) that none of them holds. A page
  none of whose turns brings ``MemoryIntake.novel`` of new weight adds
  nothing the scope has not: a question about what it holds, an answer that
  restates it, a near-duplicate. It is kept as a **record**: listed,
  exported and forgotten as any page, never ranked as evidence. A turn is
  judged on its own, so one new fact among small talk keeps its page;
* **only asking** — a page all of whose turns are the user's, every sentence
  ending in a question mark, states nothing: the Memory Router ranks it after
  every page that states (``selection.ranked``), whatever its novelty;
* **repeats** — a page whose terms are those of a page the scope holds (a
  question asked again in other words, a conversation sent again with a
  typo mended) is that page: the conversation claims it rather than writing N
  copies of one question.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence

import msgspec

from ..pages.logical import ConsolidatedPage, Page, without_turn_markers
from ..ranking.bm25 import stem
from ..text.terms import terms
from .kept import page_turns

__all__ = ["MemoryIntake", "asks", "content_terms", "idf", "novelty", "repeats", "turn_terms"]

# A sentence's end, and a question mark in the scripts that have their own (full-width, Arabic).
_SENTENCE = re.compile(r"[^.!?。！？؟]+[.!?。！？؟]*")
_ASKED = ("?", "？", "؟")
_OTHERS = re.compile(r"^\[(?!user\])[a-z_]+\] ", re.M)  # a turn marker of anyone but the user


class MemoryIntake(msgspec.Struct, frozen=True):
    """How a write-back's new pages are judged against their scope."""

    # The scope's pages a new page is weighed against (best keyword matches, of pages and of records alike):
    # as many as a question is usually answered from. More would hold, between them, the words of any turn.
    neighbours: int = 4
    # Share of a turn's term weight that must be new for the turn to inform. A question about what a scope
    # holds brings only the words of its asking (on LoCoMo's dev split most questions fall under it, and almost
    # no dialogue page: bench/memory_grown.py); one new name in a turn of a few words brings more.
    novel: float = 0.2
    # Weighted overlap (both ways) at which a new page is one the scope holds, repeated.
    repeat: float = 0.85


def turn_terms(turn: str) -> set[str]:
    """A turn's content terms, stemmed as the keyword index holds them, its "[role]" marker aside."""
    return {stem(term) for term in terms(without_turn_markers(turn))}


def content_terms(page: Page) -> set[str]:
    """A page's content terms: an Original's turns, a container's summary."""
    text = page.summary if isinstance(page, ConsolidatedPage) else without_turn_markers(page.content)
    return {stem(term) for term in terms(text)}


def idf(df: int, n: int) -> float:
    """How distinctive a term held by ``df`` of ``n`` pages is (BM25's idf; a term no page holds weighs most)."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def novelty(page: Page, held: Iterable[Collection[str]], df: Mapping[str, int], n: int) -> float:
    """The most any turn of ``page`` brings that the ``held`` pages' terms do not: the share of its term weight
    none of them holds, 0 (all held) to 1. A turn without content words brings nothing."""
    known: set[str] = set().union(*held)
    best = 0.0
    for turn in page_turns(page.content) if not isinstance(page, ConsolidatedPage) else [page.summary]:
        weights = {term: idf(df.get(term, 0), n) for term in turn_terms(turn)}
        total = sum(weights.values())
        if total > 0:
            best = max(best, sum(w for term, w in weights.items() if term not in known) / total)
    return best


def repeats(page: Page, others: Sequence[Page], df: Mapping[str, int], n: int, policy: MemoryIntake = MemoryIntake()) -> Page | None:
    """The first of ``others`` of the kind of ``page`` (asking or stating) whose terms are, both ways, ``policy.repeat`` of its term weight."""
    mine = content_terms(page)
    if not mine or isinstance(page, ConsolidatedPage):
        return None
    for other in others:
        if isinstance(other, ConsolidatedPage) or asks(other) != asks(page):
            continue
        theirs = content_terms(other)
        shared = sum(idf(df.get(t, 0), n) for t in mine & theirs)
        if shared >= policy.repeat * sum(idf(df.get(t, 0), n) for t in mine) and shared >= policy.repeat * sum(idf(df.get(t, 0), n) for t in theirs):
            return other
    return None


def asks(page: Page) -> bool:
    """Whether a page only asks: every turn the user's, and every sentence of them a question."""
    if isinstance(page, ConsolidatedPage) or not any(mark in page.content for mark in _ASKED) or _OTHERS.search(page.content):
        return False  # (asked of every candidate the Router ranks: the cheap tests first)
    turns = page_turns(page.content)
    return bool(turns) and all(turn.startswith("[user] ") and _questions(without_turn_markers(turn)) for turn in turns)


def _questions(text: str) -> bool:
    """Whether every sentence of ``text`` is a question."""
    sentences = [s.strip() for s in _SENTENCE.findall(text) if s.strip(" \n\t.!?。！？؟")]
    return bool(sentences) and all(s.endswith(_ASKED) for s in sentences)
