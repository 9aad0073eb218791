"""Long-term metabolism (§VI.5): topics, horizontal merge and vertical branching.

The first Consolidated pages above the leaves are topic groups (paging
cuts them at dated headers and topic pivots). Metabolism then works on them:

* every group gets a Topic ID (§5.3): the topic of the earlier group it is
  most like, or a new one. A group is described by its *signature*, its most
  distinctive terms, kept with the history so later requests compare against
  it without reading the pages again;
* **horizontal merge** — adjacent groups of one topic that are out of the
  near field (the latest groups, whose topic may still go on) become one
  group: the same depth, the union of their pages;
* **vertical branching** — a topic revisited across time gets a
  Consolidated page over all its groups (a "CP of CPs"): the old conclusions
  and the later fork under one node, so one Consult reaches the whole
  thread. Like merges, it works on the far field: the latest groups join
  their branch once they leave the near field.

Decisions are made left to right and known topics are kept, so a history
that grows keeps its tree; only its latest groups change.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping, Sequence

import msgspec

from ..text.terms import TF, TermStats, terms
from .logical import Page, without_turn_markers

__all__ = ["MetabolismPolicy", "SignatureSpace", "assign_topics", "branches", "horizontal_merge", "signature"]


class MetabolismPolicy(msgspec.Struct, frozen=True):
    signature_terms: int = 24  # terms kept to describe a topic group
    same_topic: float = 0.2  # signature similarity at which a group continues an earlier topic
    # A group is compared with the latest groups holding each of its terms, at most this many
    # a term: a term most groups share (a name, a greeting) would otherwise make every group
    # meet every earlier one, and paging a long history cost the square of its length.
    # A rare term still reaches back to the first group that used it.
    term_reach: int = 128
    near_field: int = 6  # the latest topic groups, never merged: their topic may go on
    merge_max: int = 10  # most pages in a horizontally merged group: an Unpacked view must stay affordable
    branch_max: int = 6  # most groups under one branch; a longer thread gets several


def signature(pages: Sequence[Page], stats: TermStats, size: int) -> tuple[str, ...]:
    """The ``size`` most distinctive terms of ``pages`` (tf·idf), numbers left out: dates are no topic."""
    counts = Counter(t for page in pages for t in terms(without_turn_markers(page.content)) if not t[:1].isdigit())
    idfs = stats.idfs
    weight = {t: TF[n] * idfs[t] for t, n in counts.items()}
    return tuple(sorted(weight, key=lambda t: (-weight[t], t))[:size])


def assign_topics(
    signatures: Sequence[tuple[str, ...]], known: Sequence[str | None], ids: Sequence[str], stats: TermStats, policy: MetabolismPolicy
) -> list[str]:
    """The Topic ID of each group, in time order.

    ``known[i]`` is group ``i``'s topic if an earlier request decided it. A new
    group takes the topic of the earlier group most like it (the cosine of
    their signatures, each term weighted by its idf), if that is at least
    ``same_topic``; else it starts a topic named after ``ids[i]`` (its first
    page). Only earlier groups that share a term are compared.
    """
    # Only the terms of groups still to decide are ever looked up: a follow-up decides
    # one or two groups, and need not index every term of the history's hundreds.
    wanted = {term for mine, decided in zip(signatures, known) if decided is None for term in mine}
    holding: dict[str, deque[int]] = {}  # wanted term -> the latest earlier groups whose signature has it
    space = SignatureSpace(stats)
    norms: dict[int, float] = {}

    def norm(i: int) -> float:
        """The norm of group ``i``'s signature, worked out once."""
        if i not in norms:
            norms[i] = space.norm(signatures[i])
        return norms[i]

    topics: list[str] = []
    for i, (mine, decided) in enumerate(zip(signatures, known)):
        if decided is None:
            shared: dict[int, float] = {}
            for term in mine:
                weight = space.weight[term]
                for j in holding.get(term, ()):
                    shared[j] = shared.get(j, 0.0) + weight
            mine_norm = norm(i)
            scores = [(total / (mine_norm * theirs), j) for j, total in shared.items() if mine_norm and (theirs := norm(j))]
            best, j = max(scores, default=(0.0, -1))
            decided = topics[j] if best >= policy.same_topic else f"T{ids[i]}"
        topics.append(decided)
        for term in wanted.intersection(mine):
            held = holding.setdefault(term, deque(maxlen=policy.term_reach))
            held.append(i)
    return topics


class SignatureSpace:
    """Signatures compared as metabolism compares them (and the Memory Consolidator after it): the
    cosine of two sets of terms, each term weighted by its idf², the weights worked out once a term."""

    def __init__(self, stats: TermStats):
        self.weight = _IdfSquared(stats)

    def norm(self, signature: Sequence[str]) -> float:
        """The length of ``signature`` in the idf-weighted space."""
        return math.sqrt(sum(map(self.weight.__getitem__, signature)))

    def similarity(self, a: Sequence[str], b: Sequence[str]) -> float:
        """The cosine of two signatures, their terms weighted by idf squared."""
        shared = set(a) & set(b)
        norm = self.norm(a) * self.norm(b) if shared else 0.0
        return sum(map(self.weight.__getitem__, shared)) / norm if norm else 0.0


class _IdfSquared(dict[str, float]):
    """idf² of each term, worked out the first time it is asked for."""

    def __init__(self, stats: TermStats):
        super().__init__()
        self.stats = stats

    def __missing__(self, term: str) -> float:
        self[term] = value = self.stats.idf(term) ** 2
        return value


def horizontal_merge(groups: Sequence[list[Page]], topics: Sequence[str], policy: MetabolismPolicy) -> tuple[list[list[Page]], list[str]]:
    """Adjacent far-field groups of one topic as one group, while it stays within ``merge_max`` pages."""
    far = max(len(groups) - policy.near_field, 0)
    merged: list[list[Page]] = []
    kept: list[str] = []
    for i, (group, topic) in enumerate(zip(groups, topics)):
        if i < far and merged and kept[-1] == topic and len(merged[-1]) + len(group) <= policy.merge_max:
            merged[-1] = [*merged[-1], *group]
        else:
            merged.append(group)  # as it is: a merge makes a new list, never extends one
            kept.append(topic)
    return merged, kept


def branches(containers: Sequence[Page], topics: Mapping[str, str], policy: MetabolismPolicy) -> list[list[Page]]:
    """The level above the topic groups: a topic met in several far-field groups as one branch, others alone.

    The near field stays out of branches, as it stays out of merges: its
    groups still change, and a branch over them would be rebuilt (and
    summarised again) on every follow-up. Returned in time order of their
    first page; a branch holds at most ``branch_max`` groups, so a long
    thread becomes several branches.
    """
    far = max(len(containers) - policy.near_field, 0)
    by_topic: dict[str, list[Page]] = {}
    for i, container in enumerate(containers):
        by_topic.setdefault(topics[container.id] if i < far else container.id, []).append(container)
    units: list[list[Page]] = []
    for members in by_topic.values():
        if len(members) == 1:
            units.append(members)
            continue
        runs = [members[i : i + policy.branch_max] for i in range(0, len(members), policy.branch_max)]
        if len(runs) > 1 and len(runs[-1]) == 1:  # a branch of one is no branch
            last = runs.pop()
            runs[-1] = [*runs[-1], *last]
        units += runs
    return sorted(units, key=lambda unit: unit[0].first_turn)
