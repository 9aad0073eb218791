"""Memory pages: a conversation's pages as they are kept across conversations (P-Mem §2).

Memory holds the very pages a conversation was paged into (``pcp_core.pages.logical``),
with ``origin`` Storage and ids that hash their content, so the same turns
written back by two conversations, or by one conversation sent again, are
one page. The tree is kept: a Consolidated page's ``source_ids`` name memory
pages, down to the verbatim Originals.

A forgotten turn never comes back: memory keeps a hash of each forgotten
turn's text, and a page written back is stripped of those turns first (a
page left empty is not written, a container is rebuilt from what is left).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence

import msgspec

from ..conversation import Conversation
from ..pages.logical import ConsolidatedPage, Origin, OriginalPage, Page, short_hash, without_turn_markers
from ..pages.summaries import consolidate, extractive_summary
from ..paging.history import PagedHistory, PagingPolicy
from ..ranking.bm25 import stem
from ..session import Session, chain_links, page_on, resume
from ..text.terms import TermStats, terms, top_keywords
from ..text.tokens import CountText

__all__ = [
    "MEMORY_ID_LENGTH",
    "conversation_pages",
    "container_id",
    "index_terms",
    "memory_pages",
    "page_turns",
    "rebuilt",
    "turn_hash",
    "turn_hashes",
    "vector_text",
    "without_turns",
]

# Longer than a conversation's 8: a scope of a million pages must not collide
# (48 bits: ~0.2% for one pair among a million), and a memory id never equals a history id.
MEMORY_ID_LENGTH = 12
_TURN = re.compile(r"^\[[a-z_]+\] ", re.M)


def original_id(content: str) -> str:
    """The memory id of an Original page, from its content."""
    return short_hash("Memory", content, length=MEMORY_ID_LENGTH)


def container_id(source_ids: Sequence[str]) -> str:
    """The memory id of a container, from its children's ids."""
    return short_hash("MemoryContainer", *source_ids, length=MEMORY_ID_LENGTH)


def page_turns(content: str) -> list[str]:
    """An Original page's turns, each line group with its "[role] " marker, in order."""
    starts = [m.start() for m in _TURN.finditer(content)]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return [content[a:b].rstrip("\n") for a, b in zip(starts, [*starts[1:], len(content)])]


def turn_hash(turn: str) -> str:
    """What memory keeps of a forgotten turn: a hash of its text, its role marker aside."""
    return short_hash("Turn", " ".join(without_turn_markers(turn).split()), length=16)


def turn_hashes(pages: Iterable[Page]) -> set[str]:
    """The hashes of every turn of the Original pages among ``pages``."""
    return {turn_hash(turn) for page in pages if isinstance(page, OriginalPage) for turn in page_turns(page.content)}


def index_terms(page: Page) -> dict[str, int]:
    """What the memory's keyword index holds of a page, stemmed: its keywords (twice, as index keys), and its
    summary — an Original's whole text, which its summary is chosen from.

    Keywords and summaries alone miss what a page says beyond its gist: on
    LoCoMo (dev) the Router's first stage then held all of a question's
    evidence for far fewer questions than with the text (bench/memory_recall.py).
    """
    counts: dict[str, int] = {}
    for term in terms(page.summary if isinstance(page, ConsolidatedPage) else without_turn_markers(page.content)):
        key = stem(term)
        counts[key] = counts.get(key, 0) + 1
    for keyword in page.keywords:
        for term in terms(keyword):
            key = stem(term)
            counts[key] = counts.get(key, 0) + 2
    return counts


def conversation_pages(session: Session, conversation: Conversation, now: str, count: CountText, policy: PagingPolicy = PagingPolicy()) -> PagedHistory:
    """The pages of all a request sends (its history and its query), paged on from ``session``, which holds its history.

    The query is part of what the user wrote to the assistant; the session pages
    it with the next request, memory now. The answer comes back as history
    with the next request, if there is one.
    """
    messages = [*conversation.history, conversation.query] if conversation.query is not None and not conversation.query_is_block else conversation.chained
    held = len(session.chain)
    if len(messages) <= held:
        return session.pages
    links = chain_links(messages[held:], after=session.chain[-1] if session.chain else "")
    extended = resume(session, held, [*session.chain, *links], now, session.id)
    return page_on(extended, messages, held, count, policy).pages


def vector_text(page: Page) -> str:
    """What a page's vector encodes: an Original's turns (what the rounds' dense recall reads too), a container's summary."""
    return page.summary if isinstance(page, ConsolidatedPage) else without_turn_markers(page.content)


def memory_pages(history: PagedHistory, forgotten: Collection[str] = (), policy: PagingPolicy = PagingPolicy()) -> list[Page]:
    """A conversation's pages as memory keeps them: children before their containers.

    Originals keep their turns verbatim (less the ``forgotten`` ones, by
    ``turn_hash``), containers their summaries; a container whose children
    changed is consolidated again from them, one left with a single child
    gives way to it. The formal pages solidified from File blocks follow,
    each on its own.
    """
    stats = TermStats.from_counts(max(len(history.leaves), 1), history.df)
    renamed: dict[str, str | None] = {}
    altered: set[str] = set()  # the conversation's pages that lost turns, or stand over one that did
    out: dict[str, Page] = {}
    for leaf in history.leaves:
        kept = without_turns(leaf, forgotten, stats, policy) if forgotten else leaf
        if kept is not leaf:
            altered.add(leaf.id)
        renamed[leaf.id] = _keep(out, _stored(kept, original_id(kept.content))) if kept is not None else None
    for page in history.containers:  # bottom up: a container's children are renamed before it
        children = [out[c] for s in page.source_ids if (c := renamed.get(s)) is not None]
        if any(s in altered for s in page.source_ids):
            altered.add(page.id)
        if len(children) < 2:
            renamed[page.id] = children[0].id if children else None
            continue
        container = rebuilt(page, children, stats, policy) if page.id in altered else page
        renamed[page.id] = _keep(out, _stored(container, container_id([c.id for c in children]), [c.id for c in children]))
    for formal in history.storage:
        solid = without_turns(formal, forgotten, stats, policy) if forgotten and isinstance(formal, OriginalPage) else formal
        if isinstance(solid, OriginalPage):
            _keep(out, _stored(solid, original_id(solid.content)))
    return list(out.values())


def rebuilt(container: Page, children: Sequence[Page], stats: TermStats, policy: PagingPolicy = PagingPolicy()) -> ConsolidatedPage:
    """``container`` consolidated again over ``children`` (some of its own were forgotten or replaced), keeping its id."""
    fresh = consolidate(children, stats, policy.keywords, policy.container_summary_chars)
    return msgspec.structs.replace(fresh, id=container.id, depth=container.depth, origin=Origin.STORAGE)


def _keep(out: dict[str, Page], page: Page) -> str:
    """Keep ``page`` in ``out`` once, and give its id."""
    out.setdefault(page.id, page)
    return page.id


def _stored(page: Page, page_id: str, source_ids: Sequence[str] | None = None) -> Page:
    """``page`` as memory keeps it: under ``page_id``, from storage, no longer a draft."""
    if source_ids is not None:
        return msgspec.structs.replace(page, id=page_id, origin=Origin.STORAGE, source_ids=tuple(source_ids), draft=False)
    return msgspec.structs.replace(page, id=page_id, origin=Origin.STORAGE, draft=False)


def without_turns(page: OriginalPage, forgotten: Collection[str], stats: TermStats, policy: PagingPolicy = PagingPolicy()) -> OriginalPage | None:
    """``page`` without the turns whose ``turn_hash`` is ``forgotten`` (its summary and keywords drawn again); None if none is left."""
    turns = page_turns(page.content)
    kept = [turn for turn in turns if turn_hash(turn) not in forgotten]
    if len(kept) == len(turns):
        return page
    if not kept:
        return None
    content = "\n".join(kept)
    weights = stats.weights(content)
    return msgspec.structs.replace(
        page, content=content, keywords=top_keywords(weights, policy.keywords), summary=extractive_summary(content, weights, policy.summary_chars)
    )
