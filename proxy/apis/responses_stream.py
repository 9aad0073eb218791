"""A streamed Responses call: the upstream's events read, the client's written.

The client's stream is the one a response with one message would have:
``response.created``, ``response.in_progress``, the message's item and text
part added, ``response.output_text.delta`` as the answer is released, then the
``…done`` events and ``response.completed`` with the usage of every upstream
call. A round that calls the client's own tools is replayed as the upstream
sent it. A failure once the stream has started is an ``error`` event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import PcpError
from .chat import Usage
from .codec import named_event
from .responses import (
    ENDED,
    item_call,
    message_item,
    new_item_id,
    output_text,
    responses_event,
    usage_of,
)

if TYPE_CHECKING:
    from .responses import ResponsesCodec

__all__ = ["ResponsesRound"]

class ResponsesRound:
    def __init__(self, codec: ResponsesCodec, usage: Usage):
        self.codec = codec
        self.usage = usage
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.response: dict[str, Any] = {}  # the upstream's response object, as the latest event that carries it
        self.released: list[str] = []  # the answer's text, as the client got it
        self.sequence = 0
        self.item_id = new_item_id()

    # -- reading the upstream's events -------------------------------------------------
    def read(self, event: dict[str, Any]) -> str:
        kind = event["type"]
        if isinstance(event.get("response"), dict):
            self.response = event["response"]
            if kind in ENDED:
                self.codec.count(self.usage, self.response)
        if kind == "response.output_text.delta":
            return str(event.get("delta") or "")
        if kind in ("response.output_item.added", "response.output_item.done"):
            self._called(event.get("output_index", 0), event.get("item"))
        elif kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta") and event.get("output_index", 0) in self.tool_calls:
            self.tool_calls[event.get("output_index", 0)]["function"]["arguments"] += str(event.get("delta") or "")
        return ""

    def _called(self, index: int, item: Any) -> None:
        call = item_call(item) if isinstance(item, dict) else None
        if call is None:
            return
        known = self.tool_calls.setdefault(index, call)
        if call["function"]["arguments"]:  # an item done holds its arguments whole
            known["function"]["arguments"] = call["function"]["arguments"]

    def calls(self) -> list[dict[str, Any]]:
        return list(self.tool_calls.values())

    # -- writing the client's ----------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> bytes:
        self.sequence += 1
        return responses_event(kind, {"sequence_number": self.sequence - 1, **fields})

    def _response(self, status: str, output: list[Any], usage: Any = None) -> dict[str, Any]:
        return {**self.codec.shown(self.response), "status": status, "output": output, "usage": usage}

    def opening(self) -> bytes:
        item = {**message_item(self.item_id, "", "in_progress"), "content": []}
        return b"".join(
            [
                self._event("response.created", response=self._response("in_progress", [])),
                self._event("response.in_progress", response=self._response("in_progress", [])),
                self._event("response.output_item.added", output_index=0, item=item),
                self._event("response.content_part.added", item_id=self.item_id, output_index=0, content_index=0, part=output_text("")),
            ]
        )

    def text(self, text: str) -> bytes:
        self.released.append(text)
        return self._event("response.output_text.delta", item_id=self.item_id, output_index=0, content_index=0, delta=text, logprobs=[])

    def failure(self, error: PcpError) -> bytes:
        return self._event("error", code=error.body.code, message=error.body.message, param=error.body.param)

    def closing(self) -> Iterator[bytes]:
        text = "".join(self.released)
        status = "incomplete" if self.response.get("status") == "incomplete" else "completed"
        item = message_item(self.item_id, text, status)
        place = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        yield self._event("response.output_text.done", **place, text=text, logprobs=[])
        yield self._event("response.content_part.done", **place, part=output_text(text))
        yield self._event("response.output_item.done", output_index=0, item=item)
        yield self._event(f"response.{status}", response=self._response(status, [item], usage_of(self.usage)))

    async def replay(self, events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """The round as the upstream sent it; its response objects the client's, the last with the usage of every call."""
        for event in events:
            response = event.get("response")
            if isinstance(response, dict):
                usage = usage_of(self.usage) if event["type"] in ENDED else response.get("usage")
                event = {**event, "response": {**self.codec.shown(response), "usage": usage}}
            yield named_event(event["type"], event)
