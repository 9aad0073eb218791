"""A chat completion's stream in chunks: its deltas read, its tool calls put together, a whole answer written as chunks.

Some servers ignore ``stream: true`` and answer with one JSON object. A
client that asked for a stream cannot read that (Claude Code retries, Codex
and opencode loop), so the proxy turns such an answer into the chunks the
provider itself would have sent, in its order: a chunk per choice with its
message as one delta, a chunk with its ``finish_reason``, the usage in a
chunk of its own. Each API's package does the same for its own events.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ...decoding import strict_json
from ..codec import text_of

__all__ = ["chat_chunks", "collect_tool_calls", "error_of", "first_deltas"]

Chunk = dict[str, Any]


def chat_chunks(completion: dict[str, Any], usage: bool = True) -> Iterator[Chunk]:
    """A chat completion as its chunks (``[DONE]`` is the caller's to write); ``usage``: its usage in a chunk of its own."""
    meta = {
        "id": completion.get("id", ""),
        "object": "chat.completion.chunk",
        "created": completion.get("created", int(time.time())),
        "model": completion.get("model", ""),
    }
    if completion.get("system_fingerprint"):
        meta["system_fingerprint"] = completion["system_fingerprint"]
    for n, choice in enumerate(completion.get("choices") or ()):
        message = choice.get("message") or {}
        delta = {"role": "assistant", "content": message.get("content")}
        for field in ("refusal", "reasoning_content"):  # what some servers say besides the content
            if message.get(field):
                delta[field] = message[field]
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        for part, finish in ((delta, None), ({}, choice.get("finish_reason") or "stop")):
            yield {**meta, "choices": [{"index": choice.get("index", n), "delta": part, "finish_reason": finish}]}
    if usage and completion.get("usage") is not None:
        yield {**meta, "choices": [], "usage": completion["usage"]}


def first_deltas(chunk: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str | None]]:
    """A chat chunk's deltas of its first choice, each with its finish reason: the one answer a translated stream relays."""
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            yield choice.get("delta") or {}, choice.get("finish_reason")


def collect_tool_calls(calls: dict[int, dict[str, Any]], deltas: Any) -> None:
    """A chat stream's ``tool_calls`` deltas added into ``calls`` (by index), as whole calls are put together."""
    for delta in deltas:
        call = calls.setdefault(delta.get("index", 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        call["id"] = delta.get("id") or call["id"]
        function = delta.get("function") or {}
        call["function"]["name"] += text_of(function.get("name"))
        call["function"]["arguments"] += text_of(function.get("arguments"))


def error_of(body: bytes) -> dict[str, Any]:
    """The error object of an upstream's error body in OpenAI's envelope (its text as the message, where it has none)."""
    try:
        parsed = strict_json(body)
    except (ValueError, RecursionError):
        return {"message": body.decode(errors="replace").strip()[:500]}
    error = parsed.get("error") if isinstance(parsed, dict) else None
    return error if isinstance(error, dict) else {"message": str(error or parsed)[:500]}
