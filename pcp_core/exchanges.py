"""The conversations of the other APIs read as chat messages, a tool's call and its result one turn.

The Responses API keeps a conversation as items, Anthropic's Messages API as
messages of content blocks: text, attachments, the model's calls of tools, their
results, and reasoning the proxy cannot read (encrypted or signed). Each API's
package (``proxy.apis.responses.conversation``, ``proxy.apis.messages.conversation``)
reads its shapes into ``Said`` values; ``chat_messages`` folds them into the chat
messages the rules page, whatever the API. Two rules hold:

* **A call and the results that answer it are one turn**: the assistant's turn
  that made the calls holds their results after them. Paging never puts a page
  boundary between a call and its result, and a query that is a tool's result
  carries the call that asked for it (the worker reads what was asked and what
  came back together).
* **Reasoning is opaque**: a codec leaves reasoning items and thinking blocks
  out, so they are neither read, nor kept in a session, nor sent again; they
  never make a turn of their own, so the turn they preceded stays whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from .text.tokens import part_text

__all__ = ["Call", "Part", "Result", "Said", "chat_messages", "text_part"]

Message = dict[str, Any]


class Part(msgspec.Struct, frozen=True, tag=True):
    """A content part: a chat text part (``text_part``), or an attachment as the API wrote it."""

    content: Any


class Call(msgspec.Struct, frozen=True, tag=True):
    """The model calls a tool: ``arguments`` as JSON text."""

    id: str
    name: str
    arguments: str


class Result(msgspec.Struct, frozen=True, tag=True):
    """What the call ``id`` returned: content parts (text parts, attachments)."""

    id: str
    parts: list[Any] = []
    error: bool = False


Piece = Part | Call | Result


class Said(msgspec.Struct, frozen=True):
    """One message of the API's conversation, as pieces in order."""

    role: str
    pieces: list[Piece]


def text_part(text: str) -> dict[str, str]:
    """Text as a chat text part."""
    return {"type": "text", "text": text}


def chat_messages(conversation: Iterable[Said]) -> list[Message]:
    """The chat messages of a conversation: one per ``Said`` that says anything, each
    result folded into the assistant turn whose call it answers (the latest with calls)."""
    messages: list[Message] = []
    calls: dict[str, str] = {}  # the latest assistant turn's calls, id → name
    exchange: list[Any] = []  # that turn's content, which its results join
    for one in conversation:
        own: list[Any] = []
        for piece in one.pieces:
            if isinstance(piece, Result):
                (exchange if piece.id in calls else own).extend(_returned(calls.get(piece.id), piece))
            elif isinstance(piece, Call):
                own.append(text_part(f"(calls {piece.name}({piece.arguments}))"))
            else:
                own.append(piece.content)
        if one.role == "assistant":
            calls = {piece.id: piece.name for piece in one.pieces if isinstance(piece, Call)}
            exchange = own
        if own:
            messages.append({"role": "tool" if _results_only(one) else one.role, "content": own})
    return messages


def _results_only(message: Said) -> bool:
    """A message of results whose calls the conversation does not hold (state the proxy cannot see)."""
    return message.role != "assistant" and all(isinstance(piece, Result) for piece in message.pieces)


def _returned(name: str | None, result: Result) -> list[Any]:
    """A result as the turn shows it: its text in one part, its attachments after it."""
    texts = [part_text(part) for part in result.parts]
    text = " ".join(text for text in texts if text)
    verb = "failed" if result.error else "returned"
    return [text_part(f"({name or 'a tool'} {verb}: {text})"), *(part for part, text in zip(result.parts, texts) if text is None)]
