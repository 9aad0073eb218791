"""A streamed Messages call: the upstream's events read, the client's written.

The client's stream is the one a message with one text block would have:
``message_start``, ``content_block_start``, a ``content_block_delta`` as the
answer is released, ``content_block_stop``, ``message_delta`` (the stop reason,
the usage of every upstream call) and ``message_stop``. A round that calls the
client's own tools is replayed as the upstream sent it. A failure once the
stream has started is an ``error`` event in Anthropic's envelope.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import anthropic_event
from .chat import Usage
from .codec import function_call, named_event
from .messages import new_message_id, relayed_stop, usage_of

if TYPE_CHECKING:
    from .messages import MessagesCodec

__all__ = ["MessagesRound"]


def _event(kind: str, **fields: Any) -> bytes:
    return named_event(kind, {"type": kind, **fields})


class MessagesRound:
    def __init__(self, codec: MessagesCodec, usage: Usage):
        self.codec = codec
        self.usage = usage
        self.tool_calls: dict[int, dict[str, Any]] = {}
        # The upstream's message as message_start tells it, and how message_delta ends it.
        self.message: dict[str, Any] = {"id": new_message_id(), "type": "message", "role": "assistant", "model": codec.model}
        self.said_usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None

    # -- reading the upstream's events -------------------------------------------------
    def read(self, event: dict[str, Any]) -> str:
        kind = event["type"]
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = {k: v for k, v in event["message"].items() if k not in ("content", "usage", "stop_reason", "stop_sequence")}
            usage = event["message"].get("usage")
            self.said_usage = dict(usage) if isinstance(usage, dict) else {}
        elif kind == "content_block_start":
            return self._started(event.get("index", 0), event.get("content_block") or {})
        elif kind == "content_block_delta":
            return self._delta(event.get("index", 0), event.get("delta") or {})
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            self.stop_reason, self.stop_sequence = delta.get("stop_reason"), delta.get("stop_sequence")
            # message_delta's counts are the message's so far; it leaves out what it does not update.
            said = {**self.said_usage, **{k: v for k, v in (event.get("usage") or {}).items() if v is not None}}
            self.codec.count(self.usage, {"usage": said})
        return ""

    def _started(self, index: int, block: dict[str, Any]) -> str:
        if block.get("type") == "tool_use":
            self.tool_calls[index] = function_call(str(block.get("id") or ""), str(block.get("name") or ""), "")
        return str(block.get("text") or "") if block.get("type") == "text" else ""

    def _delta(self, index: int, delta: dict[str, Any]) -> str:
        if delta.get("type") == "text_delta":
            return str(delta.get("text") or "")
        if delta.get("type") == "input_json_delta" and index in self.tool_calls:
            self.tool_calls[index]["function"]["arguments"] += str(delta.get("partial_json") or "")
        return ""

    def calls(self) -> list[dict[str, Any]]:
        return list(self.tool_calls.values())

    # -- writing the client's ----------------------------------------------------------
    def opening(self) -> bytes:
        message = {**self.message, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage_of(self.usage)}
        return _event("message_start", message=message) + _event("content_block_start", index=0, content_block={"type": "text", "text": ""})

    @staticmethod
    def text(text: str) -> bytes:
        return _event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})

    failure = staticmethod(anthropic_event)

    def closing(self) -> Iterator[bytes]:
        yield _event("content_block_stop", index=0)
        delta = {"stop_reason": relayed_stop(self.stop_reason), "stop_sequence": self.stop_sequence}
        yield _event("message_delta", delta=delta, usage=usage_of(self.usage))
        yield _event("message_stop")

    async def replay(self, events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """The round as the upstream sent it, its message_delta with the usage of every upstream call."""
        for event in events:
            if event["type"] == "message_delta":
                event = {**event, "usage": usage_of(self.usage)}
            yield named_event(event["type"], event)
