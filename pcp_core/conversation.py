"""A chat request's messages read as a conversation: its head, its history and its query.

The head (the leading system and developer messages) is kept as it is, so a
system prompt that changes on every call (today's date in it, say) does not
break the session; the history is what is paged; the last message is the
query. A query too large for a prompt (a file pasted with its question) is a
File block too: the session takes it as its next message, scanned.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgspec

from .pages import short_hash
from .pblock import ScanPolicy
from .tokens import CountText, function_calls, part_text

__all__ = ["HEAD_ROLES", "PLACEHOLDER", "Conversation", "attached", "fold_system", "message_text", "part_handle", "parts_of", "placeholder"]

HEAD_ROLES = ("system", "developer")

Message = dict[str, Any]


class Conversation(msgspec.Struct, frozen=True):
    head: list[Message]
    history: list[Message]
    query: Message | None  # the last message, None when the request holds only a head
    query_is_block: bool = False  # the query is paged apart as a File block (``pblock``)

    @classmethod
    def of(cls, messages: Sequence[Message], blocks: ScanPolicy, count: CountText) -> Conversation:
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

    @property
    def query_parts(self) -> list[Any]:
        """The query's parts that are not text (images, audio, files): the worker gets them as they came."""
        return list(parts_of(self.query)) if self.query is not None else []

    def history_parts(self) -> dict[str, Any]:
        """The history's parts that are not text, by handle: what a Consult on the page that shows one sends again."""
        return {part_handle(part): part for message in self.history for part in parts_of(message)}


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
    """A content part's text; a part of another kind (an image, audio, a file) by its placeholder."""
    text = part_text(part)
    return placeholder(part) if text is None else text


def parts_of(message: Mapping[str, Any]) -> Iterator[Any]:
    """The parts of ``message`` that are not text."""
    content = message.get("content")
    if isinstance(content, list):
        yield from (part for part in content if part_text(part) is None)


def part_handle(part: Any) -> str:
    """A part's handle: a hash of what it holds, so the same image resent is the same handle in every request."""
    return short_hash(msgspec.json.encode(part, order="sorted").decode())


def placeholder(part: Any) -> str:
    """What a page says in place of a part: its kind and its handle ("[image_url 3f2a9c1d]")."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    return f"[{kind if isinstance(kind, str) and _KIND.fullmatch(kind) else 'part'} {part_handle(part)}]"


_KIND = re.compile(r"[a-z_]{1,32}")
PLACEHOLDER = re.compile(r"\[[a-z_]{1,32} ([0-9a-f]{8})\]")


def attached(text: str, parts: Sequence[Any]) -> str | list[Any]:
    """A message's content: ``text``, and after it each part with its placeholder before it, as the page names it."""
    if not parts:
        return text
    content: list[Any] = [{"type": "text", "text": text}]
    for part in parts:
        content += [{"type": "text", "text": placeholder(part)}, part]
    return content


def fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` for an upstream that ignores system messages: the leading ones' text opens the first user message."""
    start = conversation_start(messages)
    if not start or start == len(messages) or messages[start].get("role") != "user":
        return messages
    said = "\n\n".join(message_text(m) for m in messages[:start])
    first = messages[start]
    content = first.get("content")
    folded = f"{said}\n\n{content}" if isinstance(content, str) else [{"type": "text", "text": said}, *(content or [])]
    return [{**first, "content": folded}, *messages[start + 1 :]]
