"""A chat request's messages read as a conversation: its head, its history and its query.

The head (the leading system and developer messages) is kept as it is, so a
system prompt that changes on every call (today's date in it, say) does not
break the session; the history is what is paged; the last message is the
query. A query too large for a prompt (a file pasted with its question) is a
File block too: the session takes it as its next message, scanned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .pblock import Scan
from .tokens import CountText, function_calls

__all__ = ["HEAD_ROLES", "Conversation", "message_text"]

HEAD_ROLES = ("system", "developer")

Message = dict[str, Any]


class Conversation(msgspec.Struct, frozen=True):
    head: list[Message]
    history: list[Message]
    query: Message | None  # the last message, None when the request holds only a head
    query_is_block: bool = False  # the query is paged apart as a File block (``pblock``)

    @classmethod
    def of(cls, messages: Sequence[Message], blocks: Scan, count: CountText) -> Conversation:
        start = conversation_start(messages)
        rest = list(messages[start:])
        query = rest[-1] if rest else None
        block = query is not None and blocks.is_block(message_text(query), count)
        return cls(head=list(messages[:start]), history=rest[:-1], query=query, query_is_block=block)

    @property
    def chained(self) -> list[Message]:
        """The messages the session's chain links: the history, and the query when the session takes it."""
        return [*self.history, self.query] if self.query_is_block and self.query is not None else self.history

    @property
    def head_text(self) -> str:
        return "\n\n".join(message_text(m) for m in self.head)

    @property
    def query_text(self) -> str:
        return message_text(self.query) if self.query is not None else ""


def conversation_start(messages: Sequence[Mapping[str, Any]]) -> int:
    """Where the conversation starts: after the head, the leading system and developer messages."""
    return next((i for i, m in enumerate(messages) if m.get("role") not in HEAD_ROLES), len(messages))


def message_text(message: Mapping[str, Any]) -> str:
    """The readable text of a chat message: content parts, tool calls and results."""
    content = message.get("content")
    if isinstance(content, list):
        text = " ".join(filter(None, map(_part_text, content)))
    else:
        text = content if isinstance(content, str) else ""
    for name, arguments in function_calls(message):
        text += f"\n(calls {name or '?'}({arguments}))"
    if message.get("name"):
        text = f"{message['name']}: {text}"
    return text


def _part_text(part: Any) -> str:
    """A content part's text; a part of another kind (an image, audio) by its type."""
    if not isinstance(part, Mapping):
        return "[part]"
    if part.get("type", "text") != "text":
        return f"[{part.get('type')}]"
    text = part.get("text")
    return text if isinstance(text, str) else ""
