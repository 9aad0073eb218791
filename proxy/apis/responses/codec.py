"""OpenAI's Responses API in protocol mode: a request's worker calls, and the answer the client gets.

Worker calls go upstream as Responses calls: the ``<PagedContext>`` as
``instructions``, the user line as ``input``. The client gets one response
object, its ``instructions`` and ``tools`` its own; streamed, the events of one
(``ResponsesRound``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import msgspec

from pcp_core import Outcome

from ...errors import PcpError
from ...sse import named_event
from ..codec import Api, ToolsCodec, Usage, split_system
from .wire import ENDED, ResponsesRules, ResponseStream, as_stream, check, failure, item_call, message_item, new_item_id, read, reply, usage, usage_of

__all__ = ["RESPONSES", "ResponsesCodec", "ResponsesRound"]

Item = dict[str, Any]


class ResponsesCodec(ToolsCodec):
    """One Responses request in protocol mode: its worker calls, and the answer it gets."""

    own_fields = ("input", "instructions", "stream", "tools", "tool_choice", "pcp_components")
    check = staticmethod(check)
    reply = staticmethod(reply)
    usage = staticmethod(usage)
    rules = ResponsesRules

    def __init__(self, body: dict[str, Any]):
        super().__init__(body)
        self.api = RESPONSES

    def router_body(self, messages: list[dict[str, Any]], model: str, max_tokens: int) -> bytes:
        """A call of the router model as a Responses call, not stored."""
        return msgspec.json.encode({"model": model, **self.prompt(messages), "max_output_tokens": max(16, max_tokens), "store": False})

    def shown(self, response: dict[str, Any]) -> dict[str, Any]:
        """A worker call's response object as the client's: its instructions and tools the client's own."""
        shown = {**response, "instructions": self.body.get("instructions"), "tools": self.tools}
        if "tool_choice" in self.body:
            shown["tool_choice"] = self.body["tool_choice"]
        return shown

    def final(self, response: dict[str, Any], outcome: Outcome, usage: Usage) -> dict[str, Any]:
        """The response the client gets: the answer as one message (a call of its own tools as it came), the answering call's usage."""
        shown = {**self.shown(response), "usage": usage_of(usage)}
        if outcome.kind == "answer":
            first: dict[str, Any] = next((item for item in response.get("output") or () if item.get("type") == "message"), {})
            status = "incomplete" if response.get("status") == "incomplete" else "completed"
            shown["output"] = [message_item(str(first.get("id") or new_item_id()), outcome.text, status)]
        return shown

    def round(self, usage: Usage) -> ResponsesRound:
        """One streamed worker call, read and written as a response's events."""
        return ResponsesRound(self, usage)

    @staticmethod
    def prompt(messages: list[dict[str, Any]], cuts: Sequence[int] = (), marks: Sequence[int] = ()) -> dict[str, Any]:
        """A worker call's chat messages as ``instructions`` and ``input`` (OpenAI caches a prefix unasked: no cuts or marks)."""
        system, rest = split_system(messages)
        prompt: dict[str, Any] = {"input": [{"role": m["role"], "content": _input_content(m["content"])} for m in rest]}
        if system:
            prompt["instructions"] = system
        return prompt

    @staticmethod
    def chat_tool(tool: Item) -> dict[str, Any]:
        """A client's tool as the rounds read it: a function by name (its definition counted for the budget);
        a hosted tool (web_search, …) as it is: the upstream runs it, so it never ends the loop."""
        if tool.get("type") in ("function", "custom") and isinstance(tool.get("name"), str):
            return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}}
        return tool

    @staticmethod
    def directive_tool(function: dict[str, Any]) -> dict[str, Any]:
        """A directive's function as a Responses function tool; not strict, as the directives' schemas leave additionalProperties open."""
        return {"type": "function", "name": function["name"], "description": function["description"], "parameters": function["parameters"], "strict": False}


def _input_content(content: Any) -> Any:
    """Chat's text parts as ``input_text``; the query's attachments (``input_image``, …) as they came."""
    if not isinstance(content, list):
        return content
    return [{"type": "input_text", "text": part["text"]} if isinstance(part, dict) and part.get("type") == "text" else part for part in content]


# -- a streamed call: the upstream's events read, the client's written ---------------------


class ResponsesRound:
    """The client's stream is the one a response with one message would have: created, in progress,
    the item and part added, a text delta as the answer is released, the ``…done`` events, then
    ``response.completed`` with the answering call's usage. A call of the client's own tools is replayed."""

    def __init__(self, codec: ResponsesCodec, usage: Usage):
        self.codec = codec
        self.usage = usage
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.response: dict[str, Any] = {}  # the upstream's response object, as the latest event that carries it
        self.released: list[str] = []  # the answer's text, as the client got it
        self.event = ResponseStream()  # the client's events
        self.item_id = new_item_id()

    # -- reading the upstream's events -------------------------------------------------
    def read(self, event: dict[str, Any]) -> str:
        """Take in one upstream event; the answer text it adds."""
        kind = event["type"]
        if isinstance(event.get("response"), dict):
            self.response = event["response"]
            if kind in ENDED:
                self.codec.usage(self.usage, self.response)
        if kind == "response.output_text.delta":
            return str(event.get("delta") or "")
        if kind in ("response.output_item.added", "response.output_item.done"):
            self._called(event.get("output_index", 0), event.get("item"))
        elif kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta") and event.get("output_index", 0) in self.tool_calls:
            self.tool_calls[event.get("output_index", 0)]["function"]["arguments"] += str(event.get("delta") or "")
        return ""

    def _called(self, index: int, item: Any) -> None:
        """An output item that calls a tool, noted (an item done holds its arguments whole)."""
        call = item_call(item) if isinstance(item, dict) else None
        if call is None:
            return
        known = self.tool_calls.setdefault(index, call)
        if call["function"]["arguments"]:  # an item done holds its arguments whole
            known["function"]["arguments"] = call["function"]["arguments"]

    def calls(self) -> list[dict[str, Any]]:
        """The round's tool calls so far."""
        return list(self.tool_calls.values())

    # -- writing the client's ----------------------------------------------------------

    def _response(self, status: str, output: list[Any], usage: Any = None) -> dict[str, Any]:
        """The client's response object at ``status``, with ``output`` and ``usage``."""
        return {**self.codec.shown(self.response), "status": status, "output": output, "usage": usage}

    def opening(self) -> bytes:
        """``response.created``, ``response.in_progress``, the message item and its text part added."""
        return self.event.started(self._response("in_progress", [])) + self.event.message_added(0, self.item_id)

    def text(self, text: str) -> bytes:
        """A text delta of the answer's message."""
        self.released.append(text)
        return self.event.text_delta(0, self.item_id, text)

    def failure(self, error: PcpError) -> bytes:
        """A failure midway: an ``error`` event, and no ``response.completed``."""
        return self.event("error", code=error.body.code, message=error.body.message, param=error.body.param)

    def closing(self) -> Iterator[bytes]:
        """The ``…done`` events of the answer's message, then ``response.completed`` with the answering call's usage."""
        text = "".join(self.released)
        status = "incomplete" if self.response.get("status") == "incomplete" else "completed"
        done, item = self.event.message_done(0, self.item_id, text, status)
        yield from done
        yield self.event(f"response.{status}", response=self._response(status, [item], usage_of(self.usage)))

    async def replay(self, events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """The round as the upstream sent it; its response objects the client's, the last with the answering call's usage."""
        for event in events:
            response = event.get("response")
            if isinstance(response, dict):
                usage = usage_of(self.usage) if event["type"] in ENDED else response.get("usage")
                event = {**event, "response": {**self.codec.shown(response), "usage": usage}}
            yield named_event(event["type"], event)


RESPONSES = Api(
    "responses",
    "/responses",
    frozenset({"input", "instructions", "model", "stream", "tools", "tool_choice"}),
    read,
    ResponsesCodec,
    failure,
    as_stream=as_stream,
)
