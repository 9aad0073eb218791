"""Prompt-token arithmetic for chat messages, independent of any tokenizer.

The host passes a ``CountText`` (tiktoken in production); this module only knows
how the chat format adds up, following OpenAI's published accounting:
3 tokens of framing per message, 1 more for a ``name``, 3 to prime the reply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "LOW_DETAIL_TOKENS",
    "PART_TOKENS",
    "Checkpoint",
    "CountText",
    "clip_tokens",
    "leading_tokens",
    "function_calls",
    "message_tokens",
    "part_text",
    "part_tokens",
    "prompt_tokens",
    "split_words",
    "unchecked",
]

CountText = Callable[[str], int]
# Called between the steps of long work (paging a history, scanning a block): the
# host's may raise to stop it — a client that left, a deadline passed. The rules
# keep nothing half done: what they return is a new value, and an exception returns none.
Checkpoint = Callable[[], None]


def unchecked() -> None:
    """A checkpoint that never stops anything."""


PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
# What a part that is not text (an image, audio, a file) costs is the upstream's to decide: an
# image by its size and detail, audio by its length. The proxy cannot see either without decoding
# them, so it counts a fixed price: OpenAI's for a 1024×1024 image at high detail (85 + 4 × 170),
# and its low-detail price for an image sent with ``detail: "low"``.
PART_TOKENS = 765
LOW_DETAIL_TOKENS = 85


def part_text(part: Any) -> str | None:
    """A content part's text (a refusal's too); None for a part that is not text."""
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type", "text")
    if kind not in ("text", "refusal"):
        return None
    text = part.get(kind)  # {"type": "text", "text": …}, {"type": "refusal", "refusal": …}
    return text if isinstance(text, str) else ""


def part_tokens(part: Any) -> int:
    """The tokens a part that is not text is counted for (``PART_TOKENS``)."""
    if not isinstance(part, Mapping):
        return PART_TOKENS
    image = part.get("image_url")
    # Chat: {"type": "image_url", "image_url": {"url", "detail"}}; Responses: {"type": "input_image", "image_url", "detail"}.
    detail = image.get("detail") if isinstance(image, Mapping) else part.get("detail") if part.get("type") == "input_image" else None
    return LOW_DETAIL_TOKENS if detail == "low" else PART_TOKENS


def message_tokens(message: Mapping[str, Any], count: CountText) -> int:
    """The prompt tokens of one chat message: its role, its content and parts, its tool calls."""
    tokens = PER_MESSAGE + count(str(message.get("role", "")))
    content = message.get("content")
    if isinstance(content, str):
        tokens += count(content)
        if len(message) == 2:  # the common case: role and content only
            return tokens
    elif isinstance(content, list):
        for part in content:
            text = part_text(part)
            tokens += part_tokens(part) if text is None else count(text)
    if message.get("name"):
        tokens += PER_NAME + count(str(message["name"]))
    for name, arguments in function_calls(message):
        tokens += count(name) + count(arguments)
    return tokens


def function_calls(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, arguments) of each function the message calls; what is not of the API's shape is passed over.

    The request goes upstream as it is, and the upstream judges it: reading it
    must not fail on what the client sent.
    """
    calls = message.get("tool_calls")
    functions = [call.get("function") for call in calls if isinstance(call, Mapping)] if isinstance(calls, list) else []
    return [(str(f.get("name", "")), str(f.get("arguments", ""))) for f in functions if isinstance(f, Mapping)]


def prompt_tokens(messages: Iterable[Mapping[str, Any]], count: CountText) -> int:
    """The prompt tokens of chat ``messages``, the reply's priming included."""
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


def leading_tokens(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """The longest opening of ``text`` within ``max_tokens``: cut there, it still starts as ``text`` does."""
    if max_tokens <= 0:
        return ""
    window = max_tokens * 8  # a token is rarely longer: a pasted file is not counted whole
    while window < len(text) and count(text[:window]) <= max_tokens:
        window *= 2
    if window >= len(text) and count(text) <= max_tokens:
        return text
    return text[: _most(min(window, len(text)), lambda n: count(text[:n]) <= max_tokens)]


def clip_tokens(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """Keep the head and the tail of ``text`` within ``max_tokens``; the middle is what goes."""
    if count(text) <= max_tokens:
        return text
    marker = " […] "
    half = _most(len(text) // 2, lambda n: count(text[:n] + marker + text[-n:]) <= max_tokens)
    return text[:half] + marker + text[-half:] if half else ""


def _most(most: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in 0..``most`` that ``fits``, by bisection: what fits at ``n`` fits at any smaller one."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
