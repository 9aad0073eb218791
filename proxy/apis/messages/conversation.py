"""An Anthropic Messages conversation read as chat messages: ``system`` its head, then its messages of content blocks.

Text is text, images and documents are attachments, a ``tool_use`` and the
``tool_result`` that answers it are one turn (``pcp_core.chat_messages``), and
thinking blocks are left out: signed or redacted, the proxy cannot read them,
and their turn stays whole.
"""

from __future__ import annotations

import json
from typing import Any

from pcp_core import Call, Part, Result, Said, chat_messages, part_text, text_part

from ..codec import text_of

__all__ = ["MARK", "anthropic_messages", "unmarked"]

Block = dict[str, Any]
MARK = "cache_control"  # Anthropic's prompt-cache mark on a block


def anthropic_messages(system: str | list[Block] | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as chat messages: ``system`` as its head, then the messages."""
    head = [{"role": "system", "content": _blocks_text(system)}] if system else []
    return [*head, *chat_messages(Said(m["role"], _pieces(m.get("content"))) for m in messages)]


def _pieces(content: Any) -> list[Any]:
    """A message's content as pieces: text, tool calls, results and attachments; thinking left out."""
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
    return text_of(value)


def unmarked(block: Any) -> Any:
    """A block without its ``cache_control``: where a client puts its marks moves from request to request
    (the newest message), and the same block must be the same turn in every one."""
    return {k: v for k, v in block.items() if k != MARK} if isinstance(block, dict) and MARK in block else block
