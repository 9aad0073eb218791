"""Anthropic's Messages API over an upstream that speaks only chat completions: the answer back.

``message_of`` writes a chat completion as a message (``finish_reason`` as
``stop_reason``, usage with the cache reads the upstream names), ``ChatEvents``
a chat stream as Anthropic's events, and ``error_body`` an upstream's error in
Anthropic's envelope.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pcp_core import short_hash

from ...decoding import strict_json
from ...errors import ANTHROPIC_TYPES
from ...sse import typed_event
from ..chat.chunks import error_of, first_deltas
from ..codec import text_of
from ..stops import Stops
from .chat_request import stop_sequences
from .wire import block_start, block_stop, message_end, message_start, text_delta

__all__ = ["ChatEvents", "error_body", "message_of", "message_usage"]

Block = dict[str, Any]
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use", "content_filter": "refusal"}


def message_usage(chat_usage: Any, pieces: int = 0) -> dict[str, int]:
    """A chat completion's usage as a message's: Anthropic's ``input_tokens`` leave out what the cache read.

    A stream the proxy cut at a stop sequence has none: its output is counted as the text chunks it
    relayed (a chat stream's chunk is a token), its input as unknown (0)."""
    counts = chat_usage if isinstance(chat_usage, dict) else {"completion_tokens": pieces}
    details = counts.get("prompt_tokens_details")
    cached = int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0)
    prompt = int(counts.get("prompt_tokens") or 0)
    return {
        "input_tokens": max(0, prompt - cached),
        "output_tokens": int(counts.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _id(prefix: str) -> str:
    """A new id with ``prefix``, as Anthropic's look."""
    return f"{prefix}_{short_hash(f'{prefix}{time.time_ns()}')}"


def _input(arguments: str) -> Any:
    """A call's arguments as the tool's input (Anthropic's is an object); what does not parse, under ``input``."""
    try:
        parsed = strict_json(arguments or "{}")  # NaN, 1e999: not JSON the client reads; kept as text
    except (ValueError, RecursionError):
        return {"input": arguments}
    return parsed if isinstance(parsed, dict) else {"input": parsed}


def _stop_reason(finish_reason: Any, called: bool, stop_sequence: str | None = None) -> str:
    """Chat's finish reason as a message's ``stop_reason``."""
    if stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if called else STOP_REASONS.get(str(finish_reason), "end_turn")


def _fired(choice: dict[str, Any], asked: dict[str, Any]) -> str | None:
    """The stop sequence that ended the answer: the proxy's finding (``stop_sequence``), or the upstream's (vLLM's ``stop_reason``)."""
    sequence = choice.get("stop_sequence", choice.get("stop_reason"))
    return sequence if isinstance(sequence, str) and sequence in stop_sequences(asked) else None


def message_of(completion: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as the message that answers ``asked``."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[Block] = [{"type": "text", "text": text_of(message["content"])}] if message.get("content") else []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or _id("toolu")),
                "name": str(function.get("name") or ""),
                "input": _input(text_of(function.get("arguments"))),
            }
        )
    called = any(block["type"] == "tool_use" for block in content)
    fired = _fired(choice, asked)
    return {
        "id": _id("msg"), "type": "message", "role": "assistant", "model": completion.get("model") or asked.get("model") or "",
        "content": content, "stop_reason": _stop_reason(choice.get("finish_reason"), called, fired), "stop_sequence": fired,
        "usage": message_usage(completion.get("usage"), int(completion.get("pieces") or 0)),
    }  # fmt: skip


def error_body(status: int, body: bytes) -> bytes:
    """An upstream's error in Anthropic's envelope: its kind by the status, its message kept."""
    error = error_of(body)
    kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": str(error.get("message") or f"the upstream answered {status}")[:500]}}).encode()


# -- a stream ------------------------------------------------------------------------------


class ChatEvents:
    """A chat completion's chunks, read as they come, written as Anthropic's events: ``message_start``, a
    text block and its deltas, a ``tool_use`` block per call and its JSON deltas, then ``message_delta``
    with the stop reason and the usage, and ``message_stop``."""

    def __init__(self, asked: dict[str, Any]):
        self.model = asked.get("model") or ""
        self.started = False
        self.blocks = 0  # content blocks opened so far
        self.open: tuple[str, Any] | None = None  # the block being written: ("text", None) or ("tool", the chunk's call index)
        self.called = False
        self.finish_reason: Any = None
        self.usage: Any = None
        sequences = stop_sequences(asked)
        self.stops = Stops(sequences) if sequences else None
        self.pieces = 0  # text chunks relayed

    @property
    def ended(self) -> bool:
        """A stop sequence fired: the rest of the upstream's stream is not the client's."""
        return self.stops is not None and self.stops.fired is not None

    def _opening(self) -> bytes:
        """``message_start``, once: the first event of the stream."""
        if self.started:
            return b""
        self.started = True
        message = {"id": _id("msg"), "type": "message", "role": "assistant", "model": self.model}
        return message_start(message, {"input_tokens": 0, "output_tokens": 0})

    def read(self, chunk: dict[str, Any]) -> bytes:
        """One chat chunk's events."""
        if chunk.get("model"):
            self.model = chunk["model"]
        out = [self._opening()]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for delta, finished in first_deltas(chunk):
            if self.ended:
                break
            if delta.get("content"):
                self.pieces += 1
                out.append(self._text(text_of(delta["content"])))
            if self.ended:
                self.finish_reason = "stop"
                break
            if delta.get("tool_calls") and self.stops is not None:
                out.append(self._text(self.stops.flush(), held=True))
            for call in delta.get("tool_calls") or ():
                out.append(self._called(call))
            self.finish_reason = finished or self.finish_reason
        return b"".join(out)

    def _text(self, text: str, held: bool = False) -> bytes:
        """Text from the upstream, less what a stop sequence holds back (``held``: what it held, released)."""
        if self.stops is not None and not held:
            text = self.stops.feed(text)
        if not text:
            return b""
        opened = self._block(("text", None), {"type": "text", "text": ""})
        return opened + text_delta(self.blocks - 1, text)

    def _block(self, which: tuple[str, Any], start: Block) -> bytes:
        """Open the block ``which`` unless it is the one open, closing that one."""
        if self.open == which:
            return b""
        out = block_stop(self.blocks - 1) if self.open is not None else b""
        self.open = which
        self.blocks += 1
        return out + block_start(self.blocks - 1, start)

    def _called(self, delta: dict[str, Any]) -> bytes:
        """The events of a tool call's delta: its ``tool_use`` block opened, then its arguments as JSON deltas."""
        self.called = True
        function = delta.get("function") or {}
        which = ("tool", delta.get("index", 0))
        out = b""
        if self.open != which:
            start = {"type": "tool_use", "id": str(delta.get("id") or _id("toolu")), "name": str(function.get("name") or ""), "input": {}}
            out = self._block(which, start)
        piece = text_of(function.get("arguments"))
        if piece:
            out += typed_event("content_block_delta", index=self.blocks - 1, delta={"type": "input_json_delta", "partial_json": piece})
        return out

    def closing(self) -> bytes:
        """The events that end the message, once the chat stream has."""
        out = [self._opening()]
        if self.stops is not None and not self.ended:
            out.append(self._text(self.stops.flush(), held=True))
        if self.open is not None:
            out.append(block_stop(self.blocks - 1))
            self.open = None
        fired = self.stops.fired if self.stops is not None else None
        delta = {"stop_reason": _stop_reason(self.finish_reason, self.called, fired), "stop_sequence": fired}
        out += message_end(delta, message_usage(self.usage, self.pieces))
        return b"".join(out)

    def failure(self, message: str, code: str = "upstream_error") -> bytes:
        """An error midway, as Anthropic's stream tells it: an ``error`` event, and no ``message_stop``."""
        return self._opening() + typed_event("error", error={"type": "api_error", "message": f"{message} ({code})"})
