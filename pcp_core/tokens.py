"""Prompt-token arithmetic for chat messages, independent of any tokenizer.

The host passes a ``CountText`` (tiktoken in production); this module only knows
how the chat format adds up, following OpenAI's published accounting:
3 tokens of framing per message, 1 more for a ``name``, 3 to prime the reply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["CountText", "message_tokens", "prompt_tokens", "split_words", "IMAGE_PART_TOKENS"]

CountText = Callable[[str], int]

PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
# An image part costs what the upstream decides; the low-detail price is a fair floor.
IMAGE_PART_TOKENS = 85


def message_tokens(message: Mapping[str, Any], count: CountText) -> int:
    tokens = PER_MESSAGE + count(str(message.get("role", "")))
    content = message.get("content")
    if isinstance(content, str):
        tokens += count(content)
        if len(message) == 2:  # the common case: role and content only
            return tokens
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                tokens += count(part["text"])
            else:
                tokens += IMAGE_PART_TOKENS
    if message.get("name"):
        tokens += PER_NAME + count(str(message["name"]))
    for call in message.get("tool_calls") or ():
        function = (call.get("function") if isinstance(call, Mapping) else None) or {}
        tokens += count(str(function.get("name", ""))) + count(str(function.get("arguments", "")))
    return tokens


def prompt_tokens(messages: Iterable[Mapping[str, Any]], count: CountText) -> int:
    return REPLY_PRIMING + sum(message_tokens(m, count) for m in messages)


def split_words(text: str, count: CountText, limit: int) -> list[str]:
    """``text`` cut into runs of consecutive words of at most about ``limit`` tokens each."""
    pieces, part = [], []
    for word in text.split(" "):
        part.append(word)
        if count(" ".join(part)) >= limit - 8:
            pieces.append(" ".join(part))
            part = []
    if part:
        pieces.append(" ".join(part))
    return pieces
