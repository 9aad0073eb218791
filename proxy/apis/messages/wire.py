"""Anthropic's Messages API on the wire: the request the proxy reads, the answers and events it checks, and writes.

The client gets one message, or its events; the proxy's own errors are in
Anthropic's envelope. A message that came whole where a stream was asked for
(a server that ignores ``stream``) is written as the events the provider
itself sends, in its order: ``message_start``, each content block started,
its text, arguments or thinking (and signature) as one delta, stopped, then
``message_delta`` and ``message_stop``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import msgspec

from pcp_core import WorkerReply, short_hash

from ...decoding import decode_json, finite_fields
from ...errors import ClientError, PcpError, anthropic_envelope
from ...sse import error_message, named_event, typed_event
from ..codec import Reading, Usage, checked, count_of, function_call
from .conversation import anthropic_messages

__all__ = [
    "MessagesRequest",
    "MessagesRules",
    "as_stream",
    "check",
    "failure",
    "message_events",
    "new_message_id",
    "read",
    "relayed_stop",
    "reply",
    "usage",
    "usage_of",
]

Block = dict[str, Any]
Event = dict[str, Any]


class MessagesRequest(msgspec.Struct):
    """What the proxy reads of a request; messages and blocks stay plain dicts, so fields it does not model survive."""

    messages: list[dict[str, Any]]
    system: str | list[Block] | None = None
    model: str | None = None
    stream: bool = False
    tools: list[Block] | None = None


_DECODER = msgspec.json.Decoder(MessagesRequest)


def read(body: bytes) -> Reading:
    """A Messages request's body as a ``Reading``, or the 400 that says what is wrong with it."""
    request: MessagesRequest = decode_json(body, _DECODER.decode, "Messages request")
    finite_fields(body, ("messages",), "Messages request")
    for i, message in enumerate(request.messages):
        if not isinstance(message.get("role"), str):
            raise ClientError(f"messages[{i}] has no role", param=f"messages.[{i}].role")
    return Reading(anthropic_messages(request.system, request.messages), request.stream, None, {"messages": request.messages}, request.model)


# -- the upstream's answers --------------------------------------------------------------


class _Block(msgspec.Struct):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Message(msgspec.Struct):
    content: list[_Block]
    usage: _Usage | None = None


def check(body: bytes) -> dict[str, Any]:
    """A message decoded, once it has the shape the proxy reads (else the 502 that says where)."""
    return checked(body, _Message, "a message", "upstream_bad_response")


def reply(message: dict[str, Any]) -> WorkerReply:
    """A message's text and tool calls (``tool_use``; a server tool's call is the upstream's own), as the rounds read them."""
    content = message.get("content") or []
    text = "".join(block.get("text") or "" for block in content if block.get("type") == "text")
    calls = [
        function_call(block.get("id") or "", block.get("name") or "", json.dumps(block.get("input"))) for block in content if block.get("type") == "tool_use"
    ]
    return WorkerReply(text=text, tool_calls=calls)


def usage(total: Usage, message: dict[str, Any]) -> None:
    """Add a message's usage to the request's: its prompt is what it read, and what the cache wrote and read."""
    counts = message.get("usage")
    written, read = count_of(counts, "cache_creation_input_tokens"), count_of(counts, "cache_read_input_tokens")
    # Anthropic's input_tokens leaves out what the cache wrote and read: the prompt is all three.
    total.add_counts(
        count_of(counts, "input_tokens") + written + read, count_of(counts, "output_tokens"), cache_creation_input_tokens=written, cache_read_input_tokens=read
    )
    if isinstance(counts, dict) and "cache_read_input_tokens" in counts:
        total.read_from_cache(read)


def usage_of(usage: Usage) -> dict[str, int]:
    """The answering call's usage (``Usage.answer``), as a message's ``usage``."""
    usage = usage.answer()
    written, read = usage.more.get("cache_creation_input_tokens", 0), usage.more.get("cache_read_input_tokens", 0)
    return {
        "input_tokens": usage.prompt_tokens - written - read,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def relayed_stop(stop_reason: str | None) -> str:
    """The answering round's stop reason, but ``end_turn`` where its tool calls were directives, taken out of the answer."""
    return "end_turn" if stop_reason in (None, "tool_use") else stop_reason


def failure(error: PcpError) -> bytes:
    """A failure once a stream has started, as Anthropic's API tells it: an ``error`` event."""
    return b"event: error\ndata: " + anthropic_envelope(error) + b"\n\n"


# -- a message's events, as the client's stream writes them (protocol mode's round, and a chat stream translated) --


def message_start(message: dict[str, Any], usage: dict[str, Any]) -> bytes:
    """``message_start``: the message before its content, with ``usage``."""
    return typed_event("message_start", message={**message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage})


def block_start(index: int, block: Block) -> bytes:
    """A content block started at ``index``."""
    return typed_event("content_block_start", index=index, content_block=block)


def text_delta(index: int, text: str) -> bytes:
    """A piece of the text block at ``index``."""
    return typed_event("content_block_delta", index=index, delta={"type": "text_delta", "text": text})


def block_stop(index: int) -> bytes:
    """The content block at ``index`` stopped."""
    return typed_event("content_block_stop", index=index)


def message_end(delta: dict[str, Any], usage: dict[str, Any], **more: Any) -> list[bytes]:
    """``message_delta`` with the stop reason and ``usage`` (and ``more``), then ``message_stop``."""
    return [typed_event("message_delta", delta=delta, usage=usage, **more), typed_event("message_stop")]


def whole(body: bytes) -> list[dict[str, Any]]:
    """A message that came whole where a stream was asked for, as its events (``message_events``)."""
    return list(message_events(check(body)))


def as_stream(body: bytes) -> bytes:
    """A message that came whole, as the event stream the client asked for."""
    return b"".join(named_event(e["type"], e) for e in whole(body))


class MessagesRules:
    """A Messages stream is whole when it ends with ``message_stop``; an ``error`` event is the upstream's failure."""

    whole = staticmethod(whole)

    def __init__(self) -> None:
        self.done = False
        self.ended = False

    @staticmethod
    def check(data: bytes) -> dict[str, Any]:
        """One event decoded, once it has the shape the proxy reads (else the 502 that says where)."""
        return checked(data, _Event, "a Messages stream event", "upstream_bad_stream")

    def failure(self, event: dict[str, Any]) -> str | None:
        """The upstream's error, if ``event`` is one; else None, and ``message_stop`` noted."""
        if event["type"] == "error":
            return error_message(event.get("error"))
        self.ended = self.ended or event["type"] == "message_stop"
        return None

    def missing(self) -> str | None:
        """What the stream lacks to be whole: its ``message_stop``."""
        return None if self.ended else "no message_stop (cut short?)"


class _Event(msgspec.Struct):
    type: str
    index: int = 0
    message: dict[str, Any] | None = None
    content_block: dict[str, Any] | None = None
    delta: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None


def new_message_id() -> str:
    """A new message id of the proxy's own."""
    return f"msg_pcp{short_hash(str(time.time_ns()))}"


def message_events(message: dict[str, Any]) -> Iterator[Event]:
    """A message as the events of its stream."""
    counts = message.get("usage")
    usage: dict[str, Any] = counts if isinstance(counts, dict) else {}
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
    """One content block as the events that stream it: started, its deltas, stopped."""
    kind = block.get("type")
    if kind == "text":
        opened, deltas = {**block, "text": ""}, [{"type": "text_delta", "text": block.get("text") or ""}]
    elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
        opened, deltas = {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}]
    elif kind == "thinking":
        thinking = [{"type": "thinking_delta", "thinking": block.get("thinking") or ""}, {"type": "signature_delta", "signature": block.get("signature") or ""}]
        opened, deltas = {**block, "thinking": "", "signature": ""}, thinking
    else:  # redacted thinking, a server tool's result: whole when started
        opened, deltas = block, []
    yield {"type": "content_block_start", "index": index, "content_block": opened}
    for delta in deltas:
        yield {"type": "content_block_delta", "index": index, "delta": delta}
    yield {"type": "content_block_stop", "index": index}
