"""A conversation's messages as turns on the Timeline, and turns grouped into Original pages (the physical trigger, §VI.5)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..conversation import message_text
from ..pages.logical import Turn
from ..text.timeline import moment, opens_with_date, stated_time
from ..text.tokens import CountText, split_words

__all__ = ["page_groups", "segment_turns", "turns_from_messages"]


def turns_from_messages(messages: Sequence[Mapping[str, Any]], seen_at: str | Sequence[str], start: int = 0, stated: str | None = None) -> list[Turn]:
    """Turns for ``messages`` (numbered from ``start``), each with its time on the Timeline.

    ``seen_at`` is when the proxy first saw the messages (one time, or one per
    message); a date the conversation states wins over it, and a message's own
    ``timestamp`` field over both (``pcp_core.text.timeline``). ``stated`` is the
    date stated last before ``start``, which dates the first messages here.
    """
    times = [seen_at] * len(messages) if isinstance(seen_at, str) else seen_at
    turns = []
    for i, (message, seen) in enumerate(zip(messages, times, strict=True), start):
        text = message_text(message)
        stated = stated_time(text) or stated
        own = message.get("timestamp")
        own = own if isinstance(own, str) and moment(own) is not None else None  # not a time: the client's own field, not ours
        turns.append(Turn(index=i, role=str(message.get("role", "user")), text=text, timestamp=own or stated or seen))
    return turns


def page_groups(turns: Sequence[Turn], count: CountText, page_tokens: int, page_turns: int) -> list[list[Turn]]:
    """``turns`` grouped into pages: at most ``page_tokens`` and ``page_turns`` each, a longer turn split, none across a dated header."""
    pieces: list[Turn] = []
    for turn in turns:
        if count(turn.text) <= page_tokens:
            pieces.append(turn)
            continue
        # A turn longer than a page becomes several pages of consecutive words.
        pieces += [msgspec.structs.replace(turn, text=part) for part in split_words(turn.text, count, page_tokens)]
    return [group for part in _dated_parts(pieces) for group in _bounded(part, count, page_tokens, page_turns)]


def _dated_parts(turns: list[Turn]) -> list[list[Turn]]:
    """``turns`` cut before every turn that opens with a dated header: a page never straddles one."""
    parts: list[list[Turn]] = []
    for turn in turns:
        if not parts or opens_with_date(turn.text):
            parts.append([])
        parts[-1].append(turn)
    return parts


def _bounded(turns: list[Turn], count: CountText, page_tokens: int, page_turns: int) -> list[list[Turn]]:
    """``turns`` cut into runs of at most ``page_tokens`` tokens and ``page_turns`` turns."""
    ranges = segment_turns([count(t.line()) for t in turns], page_tokens, page_turns)
    return [turns[r.start : r.stop] for r in ranges]


# -- segmentation ----------------------------------------------------------------


def segment_turns(token_counts: Sequence[int], max_tokens: int, max_turns: int) -> list[range]:
    """Consecutive groups of turns bounded in tokens and turns (the physical trigger, §VI.5).

    A turn larger than ``max_tokens`` gets a group of its own; the caller splits it.
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
