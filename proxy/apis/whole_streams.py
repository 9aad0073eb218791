"""An answer that came whole, as the events of the stream that would have carried it, in each API.

Some servers ignore ``stream: true`` and answer with one JSON object. A
client that asked for a stream cannot read that (Claude Code retries, Codex
and opencode loop), so the proxy turns such an answer into its API's events:
in passthrough the client gets them as the stream it asked for, and in
protocol mode a round reads them as it reads a streamed round. The events
are those the provider itself sends, in its order:

* chat completions: a chunk per choice with its message as one delta, a
  chunk with its ``finish_reason``, the usage in a chunk of its own;
* Responses: ``response.created``, ``response.in_progress``, each output
  item added, its content or arguments as one delta, done, then
  ``response.completed`` (``incomplete``, ``failed``) with the response;
* Messages: ``message_start``, each content block started, its text,
  arguments or thinking (and signature) as one delta, stopped, then
  ``message_delta`` and ``message_stop``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["chat_chunks", "message_events", "response_events"]

Event = dict[str, Any]


def chat_chunks(completion: dict[str, Any], usage: bool = True) -> Iterator[Event]:
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


def response_events(response: dict[str, Any]) -> Iterator[Event]:
    """A response object as the events of its stream, numbered by ``sequence_number``."""
    sequence = iter(range(1 << 31))

    def event(kind: str, **fields: Any) -> Event:
        return {"type": kind, "sequence_number": next(sequence), **fields}

    opened = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=opened)
    yield event("response.in_progress", response=opened)
    for index, item in enumerate(response.get("output") or ()):
        yield from _item_events(event, index, item)
    status = response.get("status") if response.get("status") in ("incomplete", "failed") else "completed"
    yield event(f"response.{status}", response=response)


def _item_events(event: Any, index: int, item: dict[str, Any]) -> Iterator[Event]:
    kind, at = item.get("type"), {"output_index": index, "item_id": item.get("id")}
    if kind == "message":
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
        for n, part in enumerate(item.get("content") or ()):
            place = {**at, "content_index": n}
            text = part.get("text") if isinstance(part, dict) else None
            yield event("response.content_part.added", **place, part={**part, "text": ""} if isinstance(text, str) else part)
            if isinstance(text, str) and part.get("type") == "output_text":
                yield event("response.output_text.delta", **place, delta=text, logprobs=[])
                yield event("response.output_text.done", **place, text=text, logprobs=[])
            yield event("response.content_part.done", **place, part=part)
    elif kind in ("function_call", "custom_tool_call"):
        field, name = ("arguments", "function_call_arguments") if kind == "function_call" else ("input", "custom_tool_call_input")
        said = item.get(field) or ""
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", field: ""})
        yield event(f"response.{name}.delta", **at, delta=said)
        yield event(f"response.{name}.done", **at, **{field: said})
    else:  # reasoning, a hosted tool's call: whole when added
        yield event("response.output_item.added", output_index=index, item=item)
    yield event("response.output_item.done", output_index=index, item=item)


def message_events(message: dict[str, Any]) -> Iterator[Event]:
    """A message as the events of its stream."""
    said = message.get("usage")
    usage: dict[str, Any] = said if isinstance(said, dict) else {}
    started = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": min(1, usage.get("output_tokens") or 0)},
    }
    yield {"type": "message_start", "message": started}
    for index, block in enumerate(message.get("content") or ()):
        yield from _block_events(index, block)
    delta = {"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")}
    yield {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage.get("output_tokens") or 0}}
    yield {"type": "message_stop"}


def _block_events(index: int, block: dict[str, Any]) -> Iterator[Event]:
    kind = block.get("type")
    if kind == "text":
        opened, deltas = {**block, "text": ""}, [{"type": "text_delta", "text": block.get("text") or ""}]
    elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
        opened, deltas = {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}]
    elif kind == "thinking":
        said = [{"type": "thinking_delta", "thinking": block.get("thinking") or ""}, {"type": "signature_delta", "signature": block.get("signature") or ""}]
        opened, deltas = {**block, "thinking": "", "signature": ""}, said
    else:  # redacted thinking, a server tool's result: whole when started
        opened, deltas = block, []
    yield {"type": "content_block_start", "index": index, "content_block": opened}
    for delta in deltas:
        yield {"type": "content_block_delta", "index": index, "delta": delta}
    yield {"type": "content_block_stop", "index": index}
