"""The conversations of the other APIs read as chat messages, a tool's call and its result one turn.

The Responses API keeps a conversation as items, Anthropic's Messages API as
messages of content blocks: text, attachments, the model's calls of tools, their
results, and reasoning the proxy cannot read (encrypted or signed). Each codec
reads its API's shapes into ``Said`` values; ``chat_messages`` folds them into
the chat messages the rules page, whatever the API. Two rules hold:

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

import json
from collections.abc import Iterable
from typing import Any

import msgspec

from .text.tokens import part_text

__all__ = ["MARK", "Call", "Part", "Result", "Said", "anthropic_messages", "chat_messages", "responses_messages", "text_part", "unmarked"]

Message = dict[str, Any]
Item = dict[str, Any]
MARK = "cache_control"  # Anthropic's prompt-cache mark on a block


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
    return {"type": "text", "text": text}


def chat_messages(said: Iterable[Said]) -> list[Message]:
    """The chat messages of a conversation: one per ``Said`` that says anything, each
    result folded into the assistant turn whose call it answers (the latest with calls)."""
    messages: list[Message] = []
    calls: dict[str, str] = {}  # the latest assistant turn's calls, id → name
    exchange: list[Any] = []  # that turn's content, which its results join
    for one in said:
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


def _results_only(said: Said) -> bool:
    """A message of results whose calls the conversation does not hold (state the proxy cannot see)."""
    return said.role != "assistant" and all(isinstance(piece, Result) for piece in said.pieces)


def _returned(name: str | None, result: Result) -> list[Any]:
    """A result as the turn shows it: its text in one part, its attachments after it."""
    texts = [part_text(part) for part in result.parts]
    said = " ".join(text for text in texts if text)
    verb = "failed" if result.error else "returned"
    return [text_part(f"({name or 'a tool'} {verb}: {said})"), *(part for part, text in zip(result.parts, texts) if text is None)]


def _text(value: Any) -> str:
    """A field that should hold text, as text: JSON for anything else, nothing for null."""
    return value if isinstance(value, str) else "" if value is None else json.dumps(value)


# -- OpenAI's Responses API: items ---------------------------------------------------------


def responses_messages(instructions: str | None, input: str | list[Item]) -> list[dict[str, Any]]:
    """The conversation as chat messages: ``instructions`` as its head, then the input items."""
    head = [{"role": "system", "content": instructions}] if instructions else []
    items = [{"role": "user", "content": input}] if isinstance(input, str) else input
    return [*head, *chat_messages(_items_said(items))]


# The items of the model's side of a turn: they make one turn together, whatever their order.
_ASSISTANT, _TOOL = "assistant", "tool"


def _items_said(items: list[Item]) -> list[Said]:
    """The items as messages: the model's calls join its turn, outputs one another; a message starts
    a turn of its own (an assistant message joins only the reasoning that came before it)."""
    said: list[Said] = []
    for item in items:
        role, pieces = _item(item)
        if role is None:
            continue
        message = item.get("type") in (None, "message")
        if said and role in (_ASSISTANT, _TOOL) and said[-1].role == role and not (message and said[-1].pieces):
            said[-1].pieces.extend(pieces)
        else:
            said.append(Said(role, pieces))
    return said


def _item(item: Item) -> tuple[str | None, list[Any]]:
    """Whose an item is, and what it says. Reasoning is the model's and says nothing here (opaque)."""
    kind = item.get("type")
    if kind in (None, "message") and isinstance(item.get("role"), str):
        return item["role"], [Part(part) for part in _item_parts(item.get("content"))]
    if not isinstance(kind, str) or kind == "reasoning":
        return (_ASSISTANT, []) if kind == "reasoning" else (None, [])
    call_id = str(item.get("call_id") or item.get("id") or "")
    if kind.endswith("_output"):  # function_call_output, custom_tool_call_output, computer_call_output, …
        return _TOOL, [Result(call_id, _item_parts(item.get("output")))]
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        return _ASSISTANT, [Call(call_id, str(item.get("name") or ""), _text(arguments))]
    if kind.endswith("_call"):  # a hosted tool's call (web_search_call, …): what it did, without what it carries opaque
        shown = {k: v for k, v in item.items() if k not in _NOT_SHOWN}
        return _ASSISTANT, [Call(call_id, str(item.get("name") or kind.removesuffix("_call")), json.dumps(shown))]
    return None, []


_NOT_SHOWN = frozenset({"type", "id", "call_id", "status", "name", "result", "encrypted_content"})


def _item_parts(content: Any) -> list[Any]:
    """Content as chat parts: text as chat's text parts, refusals as they are, anything else an attachment."""
    if content is None:
        return []
    if not isinstance(content, list):
        return [text_part(_text(content))]
    return [_item_part(part) for part in content]


def _item_part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"):
        return text_part(_text(part.get("text")))
    return part


# -- Anthropic's Messages API: content blocks -----------------------------------------------


def anthropic_messages(system: str | list[Item] | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as chat messages: ``system`` as its head, then the messages."""
    head = [{"role": "system", "content": _blocks_text(system)}] if system else []
    return [*head, *chat_messages(Said(m["role"], _pieces(m.get("content"))) for m in messages)]


def _pieces(content: Any) -> list[Any]:
    if not isinstance(content, list):
        return [Part(text_part(_blocks_text(content)))]
    pieces: list[Any] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            pieces.append(Part(text_part(_blocks_text(block.get("text")))))
        elif isinstance(kind, str) and kind.endswith("tool_use"):  # tool_use, server_tool_use, mcp_tool_use
            pieces.append(Call(str(block.get("id") or ""), str(block.get("name") or ""), json.dumps(block.get("input"))))
        elif isinstance(kind, str) and kind.endswith("tool_result"):
            pieces.append(Result(str(block.get("tool_use_id") or ""), _result_parts(block.get("content")), bool(block.get("is_error"))))
        elif kind not in ("thinking", "redacted_thinking"):  # opaque: signed, or encrypted
            pieces.append(Part(unmarked(block)))
    return pieces


def _result_parts(content: Any) -> list[Any]:
    """A tool result's content: its text; images and documents as attachments; a search result by its title and address."""
    if not isinstance(content, list):
        return [text_part(_blocks_text(content))]
    parts: list[Any] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(text_part(_blocks_text(block.get("text"))))
        elif kind in ("image", "document", "search_result"):
            parts.append(unmarked(block))
        elif isinstance(block, dict) and "url" in block:  # web_search_result and the like
            parts.append(text_part(f"{_blocks_text(block.get('title'))} ({_blocks_text(block.get('url'))})"))
    return parts


def _blocks_text(value: Any) -> str:
    """Text, or text blocks' text joined (``system`` may be either)."""
    if isinstance(value, list):
        return "\n\n".join(t for t in (part_text(block) for block in value) if t)
    return _text(value)


def unmarked(block: Any) -> Any:
    """A block without its ``cache_control``: where a client puts its marks moves from request to request
    (the newest message), and the same block must be the same turn in every one."""
    return {k: v for k, v in block.items() if k != MARK} if isinstance(block, dict) and MARK in block else block
