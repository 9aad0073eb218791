"""The Memory Router (P-Mem §3.1): the second stage, precision selection, as rules.

The first stage, broad match over a whole scope, is the host's: its keyword
index (BM25 over the pages' keywords and summaries, with the scope's
statistics), its vector index and the times the intent names each bring
candidates (``Candidate``), with what they scored. Here they are put on one
scale as the session Router puts a conversation's pages (z-scores, added),
lifted when dated in a period the intent names, faded by age and by how
seldom they were recalled, and lifted by a neighbour of their conversation
that scored well; then, with a router model, the best are read by their
summaries against the intent. What is chosen joins the request's pages, where
the rounds rank it with the history's (``pcp_core.request``).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from datetime import datetime
from typing import Any

import msgspec
import numpy as np

from ..conversation import Conversation, message_text
from ..effects import CallRouter, LoadPages
from ..pages.blocks import around_handle
from ..pages.logical import ConsolidatedPage, Page
from ..ranking.bm25 import stem
from ..ranking.router import ROUTER_CANDIDATES, Intent, anchor_intent, dated_in, precision_selection, router_prompt
from ..request import Policy, query_line
from ..text.timeline import moment
from ..text.tokens import CountText
from .fading import Metabolism, vitality
from .novelty import asks

__all__ = ["Candidate", "MemoryPolicy", "index_weights", "memory_intent", "ranked", "recalled_order", "selection"]


class MemoryPolicy(msgspec.Struct, frozen=True):
    """How memory is addressed for a request."""

    candidates: int = 200  # pages each first-stage match brings (keywords, vectors, time)
    pages: int = 40  # Original pages a request is given; its rounds rank them with the history's
    # The containers of the best pages, brought with every page they hold: shown by their summary
    # as the overview is, a Consult opens them and the best of their pages the worker has not read.
    containers: int = 4
    lexical_weight: float = 0.5  # the keyword share of a score when vectors score too (as the session Router)
    neighbour_share: float = 0.3  # of the better neighbour's score, in its own conversation
    time_weight: float = 1.0  # standard deviations for a page dated in a period the intent names
    # Fade by age and disuse, rise by Consults (``fading``): what keeps being asked for stays.
    metabolism: Metabolism = Metabolism()
    router: bool = False  # a router model reads the best candidates' summaries (x-pcp-role: memory-router)
    router_budget: int = 2048


class Candidate(msgspec.Struct, frozen=True):
    """A page the first stage brought, with what it scored there."""

    page: Page
    lexical: float = 0.0  # BM25 over keywords and summaries, with the scope's statistics
    dense: float = math.nan  # cosine with the intent's vector; NaN: not known
    recalls: int = 0  # requests it was given to before
    conversation: str = ""  # the conversation it was written back from: its neighbours are there
    parent: str = ""  # the container that holds it in memory, if one does
    idle: int = 0  # the scope's requests since it was written or last consulted
    consulted: int = 0  # Consults that opened it
    record: bool = False  # it added nothing to the scope (``novelty``): after every page that informs


def memory_intent(conversation: Conversation, policy: Policy, now: datetime | None, count: CountText) -> Intent:
    """The intent memory is addressed by: the one the rounds anchor, the history's last message standing in for its last page."""
    before, asked = around_handle(query_line(conversation, policy.paging, count))
    previous = message_text(conversation.history[-1]) if conversation.history else ""
    return anchor_intent(f"{conversation.head_text}\n{before}".strip(), asked, previous, now)


def index_weights(intent: Intent) -> dict[str, float]:
    """The intent's term weights as the keyword index holds terms (stemmed)."""
    out: dict[str, float] = {}
    for term, weight in intent.weights.items():
        key = stem(term)
        out[key] = max(out.get(key, 0.0), weight)
    return out


def ranked(intent: Intent, candidates: Sequence[Candidate], now: datetime | None, policy: MemoryPolicy = MemoryPolicy()) -> list[int]:
    """The candidates' positions, best first: pages that state, then pages that only ask (``novelty.asks``), then records."""
    if not candidates:
        return []
    score = _z([c.lexical for c in candidates])
    dense = np.array([c.dense for c in candidates], dtype=np.float64)
    if np.isfinite(dense).any():
        score = policy.lexical_weight * score + (1 - policy.lexical_weight) * _z(dense)
    timely = dated_in([c.page.timestamp for c in candidates], intent.periods) if intent.periods else None
    if timely is not None:
        score = score + policy.time_weight * timely
    ages = [_age_days(c.page.timestamp, now) if now is not None else 0.0 for c in candidates]
    score = score + np.array([vitality(age, c.recalls, c.idle, c.consulted, policy.metabolism) for age, c in zip(ages, candidates)])
    if policy.neighbour_share:
        score = score + policy.neighbour_share * _neighbours(candidates, score)
    # A page that only asks shares a later question's words and holds none of its answer: it never outranks one that states.
    tier = np.array([2 if c.record else 1 if asks(c.page) else 0 for c in candidates])
    return [int(i) for i in np.lexsort((-score, tier))]


def selection(
    intent: Intent, candidates: Sequence[Candidate], now: datetime | None, count: CountText, policy: MemoryPolicy = MemoryPolicy()
) -> Generator[CallRouter | LoadPages, Any, list[Page]]:
    """The pages a request is given: the best Originals, and the containers of the best with all they hold.

    With a router model, the best candidates are read by their summaries
    (``CallRouter``; the host sends back the reply, or None), and those it
    chooses go first. The containers' pages are asked of the host
    (``LoadPages``; it sends back those it holds).
    """
    order = [candidates[i] for i in ranked(intent, candidates, now, policy)]
    if policy.router and order:
        shown = [c.page for c in order[:ROUTER_CANDIDATES]]
        reply = yield CallRouter(router_prompt(intent, shown, policy.router_budget, count))
        if reply is not None:
            by_id = {c.page.id: c for c in order}
            order = [by_id[p] for p in precision_selection([c.page.id for c in order], reply, [p.id for p in shown])]
    order = [c for c in order if not c.record]  # kept, listed and searched; never given as what the scope knows
    leaves = [c.page for c in order if not isinstance(c.page, ConsolidatedPage)][: policy.pages]
    wanted = list(dict.fromkeys(c.parent or c.page.id for c in order if c.parent or isinstance(c.page, ConsolidatedPage)))[: policy.containers]
    containers: list[Page] = (yield LoadPages(wanted)) or [] if wanted else []
    held = {page.id for page in leaves}
    inside = [child for child in (yield LoadPages([c for p in containers for c in getattr(p, "source_ids", ()) if c not in held])) or []] if containers else []
    groups = {c.page.id: c.conversation for c in candidates}
    groups.update((child, page.id) for page in containers for child in getattr(page, "source_ids", ()) if child not in groups)
    return [
        *recalled_order([*leaves, *(p for p in inside if not isinstance(p, ConsolidatedPage))], groups),
        *containers,
        *(p for p in inside if isinstance(p, ConsolidatedPage)),
    ]


def recalled_order(pages: Sequence[Page], groups: dict[str, str]) -> list[Page]:
    """Pages in the order the rounds read them in: a conversation's pages together and in their order, conversations by time.

    The rounds lift a page by its neighbours in this order, as they do a history's.
    ``groups``: each page's conversation (or, not known, its container).
    """
    first: dict[str, str] = {}
    for page in pages:
        group = groups.get(page.id, page.id)
        first[group] = min(first.get(group, page.timestamp), page.timestamp)
    return sorted(pages, key=lambda p: (first[groups.get(p.id, p.id)], groups.get(p.id, p.id), p.first_turn))


def _neighbours(candidates: Sequence[Candidate], score: Any) -> Any:
    """For each Original, the better score of the pages just before and after it in its conversation (0 if neither is a candidate)."""
    starts: dict[tuple[str, int], int] = {}
    ends: dict[tuple[str, int], int] = {}
    for i, c in enumerate(candidates):
        if c.conversation and c.page.first_turn >= 0 and not isinstance(c.page, ConsolidatedPage):
            starts[c.conversation, c.page.first_turn] = i
            ends[c.conversation, c.page.last_turn] = i
    lift = np.zeros(len(candidates))
    for i, c in enumerate(candidates):
        if starts.get((c.conversation, c.page.first_turn)) != i:
            continue
        near = [score[j] for j in (ends.get((c.conversation, c.page.first_turn - 1)), starts.get((c.conversation, c.page.last_turn + 1))) if j is not None]
        lift[i] = max(0.0, *near) if near else 0.0
    return lift


def _age_days(timestamp: str, now: datetime) -> float:
    """Days from ``timestamp`` to ``now`` (0 when the timestamp cannot be read)."""
    when = moment(timestamp)
    return (now - when).total_seconds() / 86400 if when is not None else 0.0


def _z(values: Any) -> Any:
    """``values`` as z-scores over the finite ones (zeros when they do not spread)."""
    values = np.asarray(values, dtype=np.float64)
    known = values[np.isfinite(values)]
    spread = known.std() if len(known) else 0.0
    if not spread > 0:
        return np.zeros_like(values)
    return np.nan_to_num((values - known.mean()) / spread, nan=0.0)
