"""The Sentry (§X): token pressure switches chat mode to protocol mode, and the
history is collapsed retroactively into Original pages with Consolidated pages above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .consolidator import TermStats, consensus_keywords, extractive_summary, segment_turns, top_keywords
from .index import PageIndex
from .pages import ConsolidatedPage, Origin, OriginalPage, Page, Turn, short_hash
from .tokens import CountText

__all__ = ["PagingPolicy", "Sentry", "message_text", "retroactive_paging", "turns_from_messages"]


class Sentry(msgspec.Struct, frozen=True):
    threshold: int

    def engaged(self, prompt_tokens: int) -> bool:
        return prompt_tokens > self.threshold


class PagingPolicy(msgspec.Struct, frozen=True):
    page_tokens: int = 120  # most tokens of turns in one Original page
    page_turns: int = 4
    fanout: int = 6  # children per Consolidated page
    max_roots: int = 6  # consolidate upward until at most this many roots
    keywords: int = 6
    summary_chars: int = 180
    container_summary_chars: int = 160


def message_text(message: Mapping[str, Any]) -> str:
    """The readable text of a chat message: content parts, tool calls and results."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text", "") if isinstance(p, Mapping) and p.get("type", "text") == "text" else f"[{p.get('type', 'part') if isinstance(p, Mapping) else 'part'}]" for p in content]
        text = " ".join(p for p in parts if p)
    else:
        text = content if isinstance(content, str) else ""
    for call in message.get("tool_calls") or ():
        function = (call.get("function") if isinstance(call, Mapping) else None) or {}
        text += f"\n(calls {function.get('name', '?')}({function.get('arguments', '')}))"
    if message.get("name"):
        text = f"{message['name']}: {text}"
    return text


def turns_from_messages(messages: Sequence[Mapping[str, Any]], seen_at: str, start: int = 0) -> list[Turn]:
    """Turns for ``messages`` (numbered from ``start``); a message's own timestamp wins over ``seen_at``."""
    turns = []
    for i, message in enumerate(messages, start):
        stamp = message.get("timestamp")
        turns.append(Turn(index=i, role=str(message.get("role", "user")), text=message_text(message), timestamp=stamp if isinstance(stamp, str) else seen_at))
    return turns


def retroactive_paging(turns: Sequence[Turn], count: CountText, policy: PagingPolicy = PagingPolicy(), index: PageIndex | None = None) -> PageIndex:
    """Collapse ``turns`` into Original pages and a tree of Consolidated pages above them."""
    index = index if index is not None else PageIndex()
    groups = _split_oversized(turns, count, policy)
    contents = ["\n".join(t.line() for t in group) for group in groups]
    stats = TermStats(contents)
    level: list[Page] = [_original(group, content, stats, policy) for group, content in zip(groups, contents)]
    levels = [level]
    while len(level) > policy.max_roots:
        level = [_consolidate(level[i : i + policy.fanout], policy) for i in range(0, len(level), policy.fanout)]
        levels.append(level)
    # Depth counts from the roots (1) down; pages are frozen, so set it once the shape is known.
    renamed: dict[str, str] = {}  # the index lengthens an id that collides
    for depth_from_leaves, pages in enumerate(levels):
        depth = len(levels) - depth_from_leaves
        for page in pages:
            changes: dict[str, Any] = {"depth": depth}
            if isinstance(page, ConsolidatedPage):
                changes["source_ids"] = tuple(renamed.get(s, s) for s in page.source_ids)
            renamed[page.id] = index.register(msgspec.structs.replace(page, **changes)).id
    return index


def _split_oversized(turns: Sequence[Turn], count: CountText, policy: PagingPolicy) -> list[list[Turn]]:
    pieces: list[Turn] = []
    for turn in turns:
        if count(turn.text) <= policy.page_tokens:
            pieces.append(turn)
            continue
        # A turn longer than a page becomes several pages of consecutive words.
        words, part = turn.text.split(" "), []
        for word in words:
            part.append(word)
            if count(" ".join(part)) >= policy.page_tokens - 8:
                pieces.append(msgspec.structs.replace(turn, text=" ".join(part)))
                part = []
        if part:
            pieces.append(msgspec.structs.replace(turn, text=" ".join(part)))
    ranges = segment_turns([count(t.line()) for t in pieces], policy.page_tokens, policy.page_turns)
    return [list(pieces[r.start : r.stop]) for r in ranges]


def _original(group: list[Turn], content: str, stats: TermStats, policy: PagingPolicy) -> OriginalPage:
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


def _consolidate(children: Sequence[Page], policy: PagingPolicy) -> ConsolidatedPage:
    keywords = consensus_keywords([c.keywords for c in children], policy.keywords)
    full_text = "\n".join(c.summary for c in children)
    weights = {k: float(len(keywords) - i) for i, k in enumerate(keywords)}
    return ConsolidatedPage(
        id=short_hash("Consolidated", *(c.id for c in children)),
        origin=children[0].origin,
        depth=0,
        timestamp=children[0].timestamp,
        keywords=keywords,
        summary=extractive_summary(full_text, weights, policy.container_summary_chars),
        source_ids=tuple(c.id for c in children),
        content=full_text,
        first_turn=children[0].first_turn,
        last_turn=children[-1].last_turn,
    )
