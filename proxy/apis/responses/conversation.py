"""A Responses conversation read as chat messages: ``instructions`` its head, then its input items.

Messages are as they are, the model's calls join its turn and their outputs
answer them in it (``pcp_core.chat_messages``), a hosted tool's call is shown
by what it did, and reasoning items are left out: encrypted, the proxy cannot
read them, and the turn they preceded stays whole.
"""

from __future__ import annotations

import json
from typing import Any

from pcp_core import Call, Part, Result, Said, chat_messages, text_part

from ..codec import text_of

__all__ = ["responses_messages"]

Item = dict[str, Any]


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
    conversation: list[Said] = []
    for item in items:
        role, pieces = _item(item)
        if role is None:
            continue
        message = item.get("type") in (None, "message")
        if conversation and role in (_ASSISTANT, _TOOL) and conversation[-1].role == role and not (message and conversation[-1].pieces):
            conversation[-1].pieces.extend(pieces)
        else:
            conversation.append(Said(role, pieces))
    return conversation


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
        return _ASSISTANT, [Call(call_id, str(item.get("name") or ""), text_of(arguments))]
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
        return [text_part(text_of(content))]
    return [_item_part(part) for part in content]


def _item_part(part: Any) -> Any:
    """A content part: text as chat's text part, anything else as it is."""
    if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"):
        return text_part(text_of(part.get("text")))
    return part
