"""The Memory Consolidator (P-Mem §3.2): the session Consolidator's rules, across conversations, as rules.

The host runs it in the background over a scope. What it decides here:

* **horizontal merge** — roots of the scope's forest (pages no container
  holds) written back by different conversations, of one kind (Originals
  with Originals, containers with containers) and alike in their most
  distinctive terms (the signatures metabolism compares topic groups by),
  become the children of a new Consolidated page: the same consensus
  keywords and chosen sentences a conversation's container gets. Its
  ``source_ids`` keep the way down to the verbatim turns;
* **fade** is read where pages are ranked (``fading.fade``): by age, and by
  how seldom the Router recalls a page;
* **forgetting** — a forgotten page takes its subtree with it; the containers
  above it are consolidated again from what is left (their summaries
  quoted it), and one left with fewer than two children gives way.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..pages.logical import ConsolidatedPage, Origin, Page
from ..pages.summaries import consolidate
from ..pages.topics import SignatureSpace, signature
from ..paging.history import PagingPolicy
from ..text.terms import TermStats
from .kept import container_id

__all__ = ["ConsolidatorPolicy", "Root", "horizontal_merges"]


class ConsolidatorPolicy(msgspec.Struct, frozen=True):
    signature_terms: int = 24
    same_topic: float = 0.3  # signature similarity at which roots of two conversations merge
    merge_max: int = 8  # most children of a merged page: an Unpacked view must stay affordable
    paging: PagingPolicy = PagingPolicy()


class Root(msgspec.Struct, frozen=True):
    """A root of the scope's forest, and the conversation it came from ("" for a merged page)."""

    page: Page
    conversation: str


def horizontal_merges(
    fresh: Sequence[Root], known: Sequence[Root], stats: TermStats, policy: ConsolidatorPolicy = ConsolidatorPolicy()
) -> list[ConsolidatedPage]:
    """New containers over alike roots of different conversations.

    Each of ``fresh`` (roots written back since the last pass), in order,
    gathers the roots most like it — of ``known`` (the host's candidates:
    roots that share its terms) and the fresh before it — that are of its
    kind, from other conversations, and not merged yet in this pass; with at
    least one, they become one container's children, best first after it.
    """
    signatures = {root.page.id: signature([root.page], stats, policy.signature_terms) for root in (*known, *fresh)}
    space = SignatureSpace(stats)
    taken: set[str] = set()
    merged: list[ConsolidatedPage] = []
    for i, root in enumerate(fresh):
        if root.page.id in taken:
            continue
        mine = signatures[root.page.id]
        alike = sorted(
            ((space.similarity(mine, signatures[other.page.id]), n, other) for n, other in enumerate((*known, *fresh[:i]))
             if other.page.id not in taken and other.page.id != root.page.id and _kind(other.page) == _kind(root.page)
             and (other.conversation != root.conversation or not root.conversation)),
            key=lambda found: (-found[0], found[1]),
        )  # fmt: skip
        group = [root.page, *(other.page for score, _, other in alike if score >= policy.same_topic)][: policy.merge_max]
        if len(group) < 2:
            continue
        taken.update(page.id for page in group)
        merged.append(_container(group, stats, policy.paging))
    return merged


def _container(children: Sequence[Page], stats: TermStats, policy: PagingPolicy) -> ConsolidatedPage:
    """A memory container over ``children``, in time order."""
    ordered = sorted(children, key=lambda page: page.timestamp)
    page = consolidate(ordered, stats, policy.keywords, policy.container_summary_chars)
    ids = tuple(child.id for child in ordered)
    return msgspec.structs.replace(page, id=container_id(ids), origin=Origin.STORAGE, depth=1, source_ids=ids, first_turn=-1, last_turn=-1)


def _kind(page: Page) -> bool:
    """Whether ``page`` is a container (the consolidator groups pages by kind)."""
    return isinstance(page, ConsolidatedPage)
