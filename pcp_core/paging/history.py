"""Retroactive paging (§X): a conversation's history collapsed into Original pages
with a tree of Consolidated pages above them, incrementally: a follow-up pages
only what its session does not hold.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

import msgspec

from ..pages.blocks import PBlock, ScanPolicy, block_handle, handle_line, scan
from ..pages.index import PageIndex
from ..pages.logical import AnyPage, ConsolidatedPage, Origin, OriginalPage, Page, Turn, at_depth, short_hash, without_turn_markers
from ..pages.summaries import consolidate, extractive_summary
from ..pages.topics import MetabolismPolicy, assign_topics, branches, horizontal_merge, signature
from ..text.terms import TermStats, terms, top_keywords
from ..text.timeline import opens_with_date
from ..text.tokens import Checkpoint, CountText, unchecked
from .turns import page_groups, segment_turns, turns_from_messages

__all__ = ["PagedHistory", "PagingPolicy", "page_history", "reopened_from", "retroactive_paging", "segment_turns", "topic_groups", "turns_from_messages"]


class PagingPolicy(msgspec.Struct, frozen=True):
    page_tokens: int = 120  # most tokens of turns in one Original page
    page_turns: int = 4
    fanout: int = 6  # children per Consolidated page above the first level
    min_fanout: int = 3  # a topic group has at least this many pages, unless a dated header starts one
    max_fanout: int = 8
    pivot_overlap: float = 0.1  # a page sharing less than this with its group starts a new topic
    max_roots: int = 6  # consolidate upward until at most this many roots
    keywords: int = 6
    summary_chars: int = 180
    container_summary_chars: int = 160
    metabolism: MetabolismPolicy = MetabolismPolicy()
    blocks: ScanPolicy = ScanPolicy()  # messages too large for turns are File PBlocks


class PagedHistory(msgspec.Struct, frozen=True, kw_only=True):
    """The pages of one conversation's history, kept between requests by its session."""

    leaves: list[OriginalPage] = []  # in time order, each at its final depth
    containers: list[ConsolidatedPage] = []  # every level above the leaves, bottom up
    # In how many leaves each term occurs: the consolidator's IDF, kept as leaves come and go.
    df: dict[str, int] = {}
    # Metabolism (§VI.5): the Topic ID and the signature of each topic group (first-level container).
    topics: dict[str, str] = {}
    signatures: dict[str, tuple[str, ...]] = {}
    # The File PBlocks of the conversation's large messages, with their Draft pages;
    # and the formal pages drafts were solidified into (§VI.5), which stand in their place.
    blocks: list[PBlock] = []
    storage: list[Page] = []

    @property
    def turns(self) -> int:
        """How many turns of the conversation these pages cover."""
        return self.leaves[-1].last_turn + 1 if self.leaves else 0

    def with_summaries(self, summaries: Mapping[str, str]) -> PagedHistory:
        """These pages with the summary of every page ``summaries`` has one for (by id): a model's, say."""
        if not summaries or not any(p.id in summaries for p in (*self.leaves, *self.containers)):
            return self
        return msgspec.structs.replace(
            self, leaves=[_summarised(p, summaries) for p in self.leaves], containers=[_summarised(p, summaries) for p in self.containers]
        )

    def index(self) -> PageIndex:
        """The page index of the history: its pages, its blocks' drafts, and their tree."""
        index = PageIndex.of_tree([*self.leaves, *self.containers], self.topics)  # children before their container
        solid = {page.id: page for page in self.storage}
        for block in self.blocks:  # a solidified draft stands in its place in the block's tree
            for page in block.drafts:
                index.register(solid.get(page.id, page))
        return index


def _summarised(page: Page, summaries: Mapping[str, str]) -> Any:
    """``page`` with the summary a model wrote for it, if any."""
    summary = summaries.get(page.id)
    return page if summary is None or summary == page.summary else msgspec.structs.replace(page, summary=summary)


def retroactive_paging(turns: Sequence[Turn], count: CountText, policy: PagingPolicy = PagingPolicy()) -> PageIndex:
    """Collapse ``turns`` into Original pages and a tree of Consolidated pages above them."""
    return page_history(turns, count, policy).index()


def page_history(
    turns: Sequence[Turn],
    count: CountText,
    policy: PagingPolicy = PagingPolicy(),
    known: PagedHistory | None = None,
    reused: int = 0,
    checkpoint: Checkpoint = unchecked,
) -> PagedHistory:
    """Pages for the conversation ``turns`` (``turn.index`` is its position, from 0).

    ``known`` pages of the first ``reused`` turns are kept; only the rest is paged.
    The last kept page is reopened, so a follow-up's turns join it rather than
    leave a trail of small pages behind; the containers whose children did not
    change are reused as they are. ``checkpoint`` is called between pages.
    """
    known = known or PagedHistory()
    start = reopened_from(known, reused)
    kept = known.leaves[: _before(known.leaves, start)]
    df = dict(known.df)
    for leaf in known.leaves[len(kept) :]:
        _count_terms(df, leaf.content, -1)
    blocks, fresh_turns = _physical_blocks([t for t in turns if t.index >= start], count, policy.blocks, known.blocks, checkpoint)
    groups = page_groups(fresh_turns, count, policy.page_tokens, policy.page_turns)
    contents = ["\n".join(t.line() for t in group) for group in groups]
    for content in contents:
        _count_terms(df, content, +1)
    stats = TermStats.from_counts(len(kept) + len(groups), df)
    used = {leaf.id for leaf in kept}
    fresh = []
    for group, content in zip(groups, contents):
        checkpoint()
        fresh.append(_unique(_original(group, content, stats, policy), used))
    paged = _consolidate_levels([*kept, *fresh], df, policy, known, used, start, checkpoint)
    kept_blocks = [*(b for b in known.blocks if b.turn < start), *blocks]
    # Solidified pages go with their block, whose drafts' ids hash its message and place.
    drafts = {page.id for block in kept_blocks for page in block.drafts}
    return msgspec.structs.replace(paged, blocks=kept_blocks, storage=[page for page in known.storage if page.id in drafts])


def _physical_blocks(
    turns: list[Turn], count: CountText, policy: ScanPolicy, known: Sequence[PBlock], checkpoint: Checkpoint
) -> tuple[list[PBlock], list[Turn]]:
    """The PBlocks of the messages too large to page as turns, and the turns with their handles in their place.

    A block already scanned (the same message at the same place) is not scanned again.
    """
    scanned = {block.handle: block for block in known}
    blocks, out = [], []
    for turn in turns:
        if policy.is_block(turn.text, count):
            block = scanned.get(block_handle(turn)) or scan(turn, count, policy, checkpoint)
            blocks.append(block)
            turn = msgspec.structs.replace(turn, text=handle_line(block.handle, block.tokens, turn.text, policy))
        out.append(turn)
    return blocks, out


def reopened_from(known: PagedHistory, reused: int) -> int:
    """The first turn ``page_history`` pages again: where the last kept page starts."""
    kept = _before(known.leaves, reused)
    return known.leaves[kept - 1].first_turn if kept else 0  # (every piece of a split turn goes with it)


def _before(leaves: Sequence[OriginalPage], turn: int) -> int:
    """How many of ``leaves`` (in time order) end before ``turn``."""
    return bisect.bisect_left(leaves, turn, key=_LAST_TURN)


def _count_terms(df: dict[str, int], content: str, step: int) -> None:
    """Count ``content``'s terms in or out of the document frequencies ``df`` (``step`` 1 or -1)."""
    for term in set(terms(content)):
        left = df.get(term, 0) + step
        if left > 0:
            df[term] = left
        else:
            df.pop(term, None)


def _consolidate_levels(
    leaves: list[OriginalPage], df: dict[str, int], policy: PagingPolicy, known: PagedHistory, used: set[str], fresh_from: int, checkpoint: Checkpoint
) -> PagedHistory:
    """The leaves and the tree of containers above them, every page at its final depth.

    The first containers follow the topics (topic groups, merged and branched
    by metabolism); above them, time (the temporal backbone). The leaves from
    turn ``fresh_from`` on are new; those before it are ``known``'s.
    """
    if len(leaves) <= policy.max_roots:
        return PagedHistory(leaves=[at_depth(leaf, 1) for leaf in leaves], df=df)
    reusable = {c.source_ids: c for c in known.containers}
    stats = TermStats.from_counts(len(leaves), df)
    signatures: dict[tuple[str, ...], tuple[str, ...]] = {}  # by the ids of a group's pages

    def signed(key: tuple[str, ...], group: Sequence[Page]) -> tuple[str, ...]:
        """The signature of ``group``, reused from the known history where it can be."""
        if key not in signatures:
            checkpoint()
            mine = reusable.get(key)
            signatures[key] = (known.signatures.get(mine.id) if mine else None) or signature(group, stats, policy.metabolism.signature_terms)
        return signatures[key]

    def container(key: tuple[str, ...], group: Sequence[Page]) -> ConsolidatedPage:
        """The container over ``group``, reused from the known history where it can be."""
        checkpoint()
        return reusable.get(key) or _unique(consolidate(group, stats, policy.keywords, policy.container_summary_chars), used)

    groups = _first_level(leaves, df, policy, known.containers)
    keys = [_ids(g) for g in groups]
    decided = [known.topics.get(mine.id) if (mine := reusable.get(key)) else None for key in keys]
    topics = assign_topics([signed(k, g) for k, g in zip(keys, groups)], decided, [k[0] for k in keys], stats, policy.metabolism)
    known_keys = {id(g): k for g, k in zip(groups, keys)}  # a group the merge leaves is the same list (ids unique while ``groups`` lives)
    merged, topics = horizontal_merge(groups, topics, policy.metabolism)
    keys = [known_keys.get(id(g)) or _ids(g) for g in merged]
    groups = merged
    firsts = [container(k, g) for k, g in zip(keys, groups)]
    by_id = {c.id: (t, signed(k, g)) for c, k, g, t in zip(firsts, keys, groups, topics)}
    level: list[Page] = list(firsts)
    above: dict[str, ConsolidatedPage] = {}  # the containers over the topic groups, bottom up

    def up(groups: Sequence[list[Page]]) -> list[Page]:
        """One level up: a container over each group (a group of one goes up as it is)."""
        # A group of one page goes up as it is: no container stands over a single page.
        pages = [group[0] if len(group) == 1 else container(_ids(group), group) for group in groups]
        above.update((p.id, p) for p in pages if isinstance(p, ConsolidatedPage) and p.id not in by_id)
        return pages

    if len(level) > policy.max_roots:
        level = up(branches(level, {c: t for c, (t, _) in by_id.items()}, policy.metabolism))
    while len(level) > policy.max_roots:
        level = up(_backbone(level, policy))
    containers = {c.id: c for c in (*firsts, *above.values())}
    depths = _new_depths(level, containers, fresh_from)
    return PagedHistory(
        leaves=[at_depth(p, depths[p.id]) if p.id in depths else p for p in leaves],  # on a follow-up most stay where they were
        containers=[at_depth(p, depths.get(p.id, p.depth)) for p in containers.values()],
        df=df,
        topics={c: t for c, (t, _) in by_id.items()},
        signatures={c: sig for c, (_, sig) in by_id.items()},
    )


_ID = attrgetter("id")
_LAST_TURN = attrgetter("last_turn")


def _new_depths(roots: Sequence[Page], containers: Mapping[str, ConsolidatedPage], fresh_from: int) -> dict[str, int]:
    """The depth, counted from the root (1) down, of each page whose depth may have changed.

    A known container still at its depth, over turns before ``fresh_from``,
    has the subtree it had (its id hashes its children's) with every page in
    it at its depth: the walk stops there. On a follow-up, that is most of
    the tree.
    """
    depths: dict[str, int] = {}
    level, depth = [page.id for page in roots], 1
    while level:
        down: list[str] = []
        for page_id in level:
            page = containers.get(page_id)
            if page is not None and page.depth == depth and page.last_turn < fresh_from:
                continue
            depths[page_id] = depth
            if page is not None:
                down += page.source_ids
        level, depth = down, depth + 1
    return depths


def _ids(group: Sequence[Page]) -> tuple[str, ...]:
    """The ids of a group's pages."""
    return tuple(map(_ID, group))


def _backbone(level: Sequence[Page], policy: PagingPolicy) -> list[list[Page]]:
    """The temporal backbone: consecutive runs of ``fanout`` pages (the last may be shorter)."""
    return [list(level[i : i + policy.fanout]) for i in range(0, len(level), policy.fanout)]


def _first_level(leaves: list[OriginalPage], df: dict[str, int], policy: PagingPolicy, known: Sequence[ConsolidatedPage]) -> list[list[Page]]:
    """Topic groups of ``leaves``: those of the known first-level containers, then the rest grouped anew.

    Groups are decided left to right, so a known group over kept leaves stands;
    only the last one is reopened, as its topic may go on.
    """
    groups: list[list[Page]] = []
    covered = 0
    for container in known:  # bottom up: the first level comes first
        group: list[Page] = list(leaves[covered : covered + len(container.source_ids)])
        if _ids(group) != container.source_ids:
            break
        groups.append(group)
        covered += len(group)
    if groups:
        covered -= len(groups.pop())
    return groups + topic_groups(leaves[covered:], df, policy, documents=len(leaves))


def topic_groups(pages: Sequence[Page], df: dict[str, int], policy: PagingPolicy, documents: int | None = None) -> list[list[Page]]:
    """Consecutive pages grouped by topic (§VI.5 semantic trigger), bounded in size (physical trigger).

    A page starts a new group when it opens with a dated header, or when the
    group has ``min_fanout`` pages and little of what the page says (weighted by
    idf) was in the group before. Decided left to right, so the groups of a
    conversation stay the same as it grows, except the last. ``df`` counts terms
    over ``documents`` pages (by default, ``pages``).
    """
    stats = TermStats.from_counts(documents or len(pages), df)
    groups: list[list[Page]] = []
    current: list[Page] = []
    group_words: set[str] = set()
    for page in pages:
        words = set(terms(page.content))
        if current and (
            len(current) >= policy.max_fanout
            or _dated(page)
            or (len(current) >= policy.min_fanout and _overlap(words, group_words, stats) < policy.pivot_overlap)
        ):
            groups.append(current)
            current, group_words = [], set()
        current.append(page)
        group_words |= words
    return [*groups, current] if current else groups


def _dated(page: Page) -> bool:
    """Whether ``page`` opens with a date header."""
    return opens_with_date(without_turn_markers(page.content))  # a header starts a page (_dated_parts)


def _overlap(words: set[str], seen: set[str], stats: TermStats) -> float:
    """The idf-weighted share of ``words`` already in ``seen``."""
    idf = stats.idfs.__getitem__
    total = sum(map(idf, words))
    return sum(map(idf, words & seen)) / total if total else 1.0


def _unique(page: AnyPage, used: set[str]) -> AnyPage:
    """The page with an id no other page of the history has (a short hash can collide)."""
    if page.id in used:
        # Pages of equal text at one place (the pieces of a long message that repeats
        # itself) hash alike: a counter tells them apart, where lengthening the hash
        # alone would run out of digits and loop for ever.
        n = 0
        while short_hash(page.id, page.content, str(n)) in used:
            n += 1
        page = msgspec.structs.replace(page, id=short_hash(page.id, page.content, str(n)))
    used.add(page.id)
    return page


def _original(group: list[Turn], content: str, stats: TermStats, policy: PagingPolicy) -> OriginalPage:
    """The Original page over a group of turns."""
    weights = stats.weights(content)
    first, last = group[0], group[-1]
    return OriginalPage(
        id=short_hash("Original", str(first.index), content),
        origin=Origin.HISTORY,
        depth=0,
        timestamp=first.timestamp,
        keywords=top_keywords(weights, policy.keywords),
        summary=extractive_summary(content, weights, policy.summary_chars),
        content=content,
        first_turn=first.index,
        last_turn=last.index,
    )
