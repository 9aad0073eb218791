"""Where a session's live PACT components render (``pact``): beside what they are about.

Below the Sentry's threshold the request's own messages carry them
(``onto_messages``): system level in the leading system message (one is
added when there is none), the others in their message's content, before
it (offset < 0) or after it, in render order. A message keeps its role and
its place, so a conversation's shape (roles alternating, a tool result after
its call) is what the upstream would have had anyway.

In protocol mode a component travels with its message's page (``onto_pages``):
as a ``[component]`` line at the end of the Original page that holds the
message, so it is inside that page's ``Node``, escaped as all text is, read
by the Router with the page's words, and never paged apart from it.
Components of the current message join the Query, system-level ones the head.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec

from ..conversation import conversation_start
from ..paging.history import PagedHistory
from .tree import Component, Tree, is_live, select

__all__ = ["COMPONENT_MARKER", "Placement", "around", "onto_messages", "onto_pages", "placement"]

COMPONENT_MARKER = "[component]"  # a page's line that is a component, not a turn
_FIRST_TURN = attrgetter("first_turn")

Message = dict[str, Any]


class Placement(msgspec.Struct, frozen=True):
    """The components that render in a tree's turn, by where."""

    system: list[Component] = []
    messages: dict[int, list[Component]] = {}  # by the message's place in the conversation (after its head), in order

    @property
    def count(self) -> int:
        """How many components are placed."""
        return len(self.system) + sum(map(len, self.messages.values()))


def placement(tree: Tree) -> Placement:
    """Where each component live in the tree's turn renders; those whose depth is beyond the conversation do not."""
    system: list[Component] = []
    messages: dict[int, list[Component]] = {}
    count = tree.count or 0
    for component in select(tree):  # render order: system level, then oldest message first
        if not is_live(component, tree.turn):
            continue
        if component.depth < 0:
            system.append(component)
        elif component.depth < count:
            messages.setdefault(count - 1 - component.depth, []).append(component)
    return Placement(system=system, messages=messages)


def around(text: str, components: Sequence[Component]) -> str:
    """``text`` with ``components`` before it (offset < 0) and after it, a blank line apart."""
    before = [c.content for c in components if c.offset < 0]
    after = [c.content for c in components if c.offset >= 0]
    return "\n\n".join([*before, text, *after] if text else [*before, *after])


def _with_components(message: Message, components: Sequence[Component]) -> Message:
    """A copy of ``message`` whose content carries ``components``: as text parts when its content is a list of parts."""
    content = message.get("content")
    if isinstance(content, list):
        part = lambda c: {"type": "text", "text": c.content}  # noqa: E731
        content = [*(part(c) for c in components if c.offset < 0), *content, *(part(c) for c in components if c.offset >= 0)]
    else:
        content = around(content if isinstance(content, str) else "", components)
    return {**message, "content": content}


def onto_messages(messages: Sequence[Message], placed: Placement) -> list[Message]:
    """A copy of the request's ``messages`` with the components of ``placed`` in place (the messages themselves are not changed)."""
    start = conversation_start(messages)
    out = list(messages)
    for i, components in placed.messages.items():
        if start + i < len(out):
            out[start + i] = _with_components(out[start + i], components)
    if placed.system:
        if start > 0:
            out[0] = _with_components(out[0], placed.system)
        else:
            out.insert(0, {"role": "system", "content": around("", placed.system)})
    return out


def onto_pages(pages: PagedHistory, placed: Placement, history: int) -> tuple[PagedHistory, int]:
    """``pages`` with the components of the first ``history`` messages in the pages that hold them, and how many were placed.

    A message split across pages (too long for one) carries them in the page where it ends.
    """
    lines: dict[int, list[str]] = {}
    for i, components in placed.messages.items():
        leaf = bisect.bisect_right(pages.leaves, i, key=_FIRST_TURN) - 1  # the last page the message is in
        if i < history and leaf >= 0 and pages.leaves[leaf].first_turn <= i <= pages.leaves[leaf].last_turn:
            lines.setdefault(leaf, []).extend(f"{COMPONENT_MARKER} {c.content}" for c in components)
    if not lines:
        return pages, 0
    leaves = list(pages.leaves)
    for leaf, added in lines.items():
        leaves[leaf] = msgspec.structs.replace(leaves[leaf], content="\n".join([leaves[leaf].content, *added]))
    return msgspec.structs.replace(pages, leaves=leaves), sum(map(len, lines.values()))
