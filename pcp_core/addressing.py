"""Addressing (§VI.1–2): a request's intent anchored, and its pages ranked by it before round 0.

BM25 always; dense recall when the host embeds (``Similarity``); the router
model's pick among the best, when the host has one (``CallRouter``).
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from .conversation import fold_system
from .effects import CallRouter, Effect, Similarity
from .pages.blocks import around_handle
from .pages.index import PageIndex
from .pages.logical import Origin, Page
from .ranking.bm25 import Bm25Cache
from .ranking.router import (
    ROUTER_CANDIDATES,
    Intent,
    anchor_intent,
    broad_match,
    dense_scores,
    dense_texts,
    lexical_scores,
    precision_selection,
    router_prompt,
    unit_texts,
)
from .text.timeline import moment
from .text.tokens import CountText

if TYPE_CHECKING:
    from .round_policy import RoundContext

__all__ = ["Addressed", "address"]


class Addressed(msgspec.Struct, frozen=True):
    """What the Router made of the request before round 0: the intent, and the pages by it."""

    intent: Intent
    leaves: list[Page]  # the history's Original pages, and the Draft pages of its PBlocks
    texts: list[str]  # their unit texts, which broad match scores
    ranked: list[str]  # best first
    now: datetime | None


def address(context: RoundContext, index: PageIndex, count: CountText, cache: Bm25Cache | None) -> Generator[Effect, Any, Addressed]:
    """Anchor the intent (head + tail) and rank the pages by it: BM25, dense recall when the host embeds, the router model's pick."""
    leaves = list(index.leaves())
    last_history = next((page for page in reversed(leaves) if page.origin == Origin.HISTORY), None)
    now = moment(context.current_time)
    # A query that is a File block (``RoundContext.query``) is asked by what follows the file;
    # what precedes it weighs as the head does.
    before, asked = around_handle(context.query)
    intent = anchor_intent(f"{context.head}\n{before}".strip(), asked, last_history.summary if last_history is not None else "", now)
    texts = unit_texts(leaves)
    lexical = lexical_scores(intent, texts, cache)  # before the dense reading: the host encodes the query meanwhile
    dense = None
    if context.dense and texts:
        cosines = yield Similarity(intent.text, dense_texts(texts))
        if cosines is not None:
            dense = dense_scores(cosines, len(texts))
    ranked = broad_match(intent, leaves, lexical, dense)
    if context.policy.router and ranked:
        candidates = ranked[:ROUTER_CANDIDATES]
        prompt = router_prompt(intent, [index.get(p) for p in candidates], context.policy.budget, count)
        reply = yield CallRouter(fold_system(prompt) if context.policy.context_role == "user" else prompt)
        if reply is not None:
            ranked = precision_selection(ranked, reply, candidates)
    return Addressed(intent=intent, leaves=leaves, texts=texts, ranked=ranked, now=now)
