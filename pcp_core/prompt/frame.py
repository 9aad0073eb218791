"""The frame: a conversation's stable prefix, a frozen rendering of its history replayed byte for byte.

Providers' prompt caches (OpenAI's and Anthropic's, a llama.cpp slot) reuse the
longest prefix a prompt shares with an earlier one, at a tenth of the price or
for free. A request ranked afresh shares almost nothing with the one before:
every follow-up would pay for all of its prompt. So a conversation keeps a
frame, like a log kept by compaction:

* it is the document's text after the ``Static_Registry``: the
  ``Background_Context`` and the head of the ``Linear_Flow`` — the overview
  (the roots by their Summary) and the latest closed pages verbatim — as they
  were rendered when the frame was made;
* a follow-up that continues the conversation replays it byte for byte and
  appends the pages since at its end (``extended``); after it comes only
  what is new with the request: the pages ranked for its query, within a share
  of the budget, the trace, the Query and the time;
* the pages ranked for the previous request that this one ranks again keep
  their place too, with those shown before them (within a follow-up's
  share): they join the frame before the new turns' pages (``after``: what
  came after the frame, in order), so what a conversation keeps coming back
  to is billed once;
* it is made again only at rare boundaries: when it leaves too little room
  (the new frame is then part of what that follow-up adds, within its
  share), and when a request does not continue the conversation it was made
  for (an edited or regenerated question is a sibling, ranked afresh).

Pages are shown in it as they were; a Consult on one shows it again, after it.
The conversation's tree moves on meanwhile: a container that takes the turns
since gets a new id (ids hash what a page holds). The frame keeps the
turns each page it shows covers, so a Consult on one the tree has replaced
opens the page that holds those turns now (``stand_in``), where it would
otherwise fault and cost the request its rounds.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..pages.logical import Origin, Page, View
from ..text.tokens import CountText
from .markup import node_lines

__all__ = ["Frame", "Shown", "continues", "extended", "prompt_text", "ranked_again", "shared_tokens", "spans_of", "stand_in", "stored_end"]


class Shown(msgspec.Struct, frozen=True):
    """A page shown after the frame, as the document had it (a top-level node's text)."""

    id: str
    view: View
    text: str


class Frame(msgspec.Struct, frozen=True):
    """The frozen head of a conversation's document, and what it shows."""

    text: str  # the document after the Static_Registry: Background_Context, "<Linear_Flow>", its nodes
    shown: dict[str, View]  # the pages it shows, at their view (a page may show again, higher, after it)
    tokens: int  # its tokens, counted as the host counts what it builds
    turns: int  # the history's closed pages of turns before this one are in it; later ones are appended
    line: str  # the chain link of the query it was made (or last extended) for
    at: int  # where that query is in the conversation
    after: list[Shown] = []  # what that request showed after it (the last page aside), in order
    spans: dict[str, tuple[int, int]] = {}  # the turns (first, last) each page it shows covers
    # Where in ``text`` earlier requests' prompts put a block's end (Anthropic finds a cache entry only at one, and
    # a prefix cut otherwise is another prefix): each call that replays the frame cuts its text there too.
    cuts: list[int] = []


def continues(frame: Frame, links: Sequence[str]) -> bool:
    """Whether a request whose chain is ``links`` goes on from the query ``frame`` was made for: its
    history holds that query. A sibling of it (the question edited or asked again) does not."""
    return len(links) > frame.at and links[frame.at] == frame.line


def extended(frame: Frame, pages: Sequence[Page], count: CountText, line: str, at: int, kept: Sequence[Shown] = ()) -> Frame:
    """``frame`` with ``kept`` (the opening run of what came after it that still ranks) and ``pages`` (closed pages
    of the turns since, in order, in Detail) after it, for the query at ``at``."""
    new = [page for page in pages if page.id not in frame.shown and page.id not in {s.id for s in kept}]
    text = "".join(s.text for s in kept) + "".join(node_lines(page, View.DETAIL) for page in new)
    turns = max([frame.turns, *(page.last_turn + 1 for page in new)])
    shown = {**frame.shown, **{s.id: s.view for s in kept}, **{page.id: View.DETAIL for page in new}}
    tokens = frame.tokens + (count(text) if text else 0)
    stored, previous = len(frame.text), len(frame.text) + sum(len(s.text) for s in kept)  # the ends of the frame, and of the prompt, before
    cuts = list(dict.fromkeys([*frame.cuts, stored, previous]))
    return Frame(text=frame.text + text, shown=shown, tokens=tokens, turns=turns, line=line, at=at, spans=frame.spans, cuts=cuts)


def ranked_again(after: Sequence[Shown], best: Sequence[Page], share: int, count: CountText) -> tuple[list[Shown], int]:
    """What the previous request showed after its frame (``after``), kept in its place up to the last page this one
    would show too (of its ``best``-ranked pages, those a follow-up's ``share`` holds): billed once, from the cache,
    where showing them again after the new turns would bill them in full. The pages between come along, from the
    cache too, within the same share (what is kept must leave the request its room); their tokens are returned
    with the run."""
    wanted, used = set(), 0
    for page in best:
        used += count(node_lines(page, View.DETAIL))
        if used > share:
            break
        wanted.add(page.id)
    run = used = stale = stale_in_run = 0
    for i, shown in enumerate(after):
        tokens = count(shown.text)
        used += tokens
        if used > share:
            break
        if shown.id in wanted:
            run, stale_in_run = i + 1, stale
        else:
            stale += tokens
    return list(after[:run]), stale_in_run


def spans_of(pages: Sequence[Page]) -> dict[str, tuple[int, int]]:
    """The turns each of ``pages`` covers, by id."""
    return {page.id: (page.first_turn, page.last_turn) for page in pages}


def stand_in(frame: Frame, pages: Mapping[str, Page], page_id: str) -> str | None:
    """The page that now holds the turns of ``page_id``, one ``frame`` shows that is no longer one of the
    conversation's ``pages``: the smallest that covers them all (the deepest, at a tie). None: ``page_id`` is
    still a page, the frame does not show it, or no page covers its turns."""
    span = frame.spans.get(page_id)
    if span is None or page_id in pages:
        return None
    first, last = span
    covering = [page for page in pages.values() if page.origin == Origin.HISTORY and page.first_turn <= first and page.last_turn >= last]
    best = min(covering, key=lambda page: (page.last_turn - page.first_turn, -page.depth), default=None)
    return best.id if best is not None else None


def stored_end(stored: Frame | None, frame_text: str, frame_end: int) -> int | None:
    """Where the frame a request went on from ends in a document whose frame is ``frame_text`` (ending at
    ``frame_end``), when the document replays it: the previous request's entry in a provider's cache."""
    if stored is None or not frame_text.startswith(stored.text):
        return None
    return frame_end - len(frame_text) + len(stored.text)


def shared_tokens(previous: str, text: str, stored: int | None, count: CountText) -> int:
    """Tokens of ``text``'s opening the call before it had too: the ``previous`` call's prompt (a later round), or, for
    a request's first call, the frame it replayed up to ``stored``: what a provider's cache may serve, to a whole line."""
    common = os.path.commonprefix([previous, text]) if previous else text[:stored] if stored is not None else ""
    common = common[: common.rfind("\n") + 1]  # a whole line: a token may straddle where they part
    return count(common) if common else 0


def prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of a worker prompt's user message (its last): the opening and the document, where a provider's
    cache finds a prefix after the head (the same on every call)."""
    content = messages[-1].get("content") if messages else ""
    if isinstance(content, list):  # with the parts after the text
        content = next((part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"), "")
    return content if isinstance(content, str) else ""
