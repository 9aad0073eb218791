"""OpenAI's Responses API (``POST /v1/responses``): what the proxy reads of a request, and how it speaks to both sides.

Only the stateless form is paged: the conversation is the request's ``input``
items and its ``instructions``. A request that leans on state the proxy cannot
see (``previous_response_id``, ``conversation``, a stored ``prompt``, an
``item_reference``, ``background``) goes through untouched, whatever its size.

Input items are read as chat messages (``pcp_core.chat_messages``): messages
as they are, a function call and its output one turn, reasoning items left
out. Worker calls go upstream as Responses calls: the ``<PagedContext>`` as
``instructions``, the user line as ``input``. The client gets one response
object, its ``instructions`` and ``tools`` its own; streamed, the events of one
(``ResponsesRound``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import msgspec

from pcp_core import Outcome, WorkerReply, responses_messages, short_hash

from ..decoding import decode_json, finite_fields
from ..errors import PcpError
from ..sse import named_event, said
from .codec import Api, Reading, ToolsCodec, Usage, checked, count_of, function_call, split_system, text_of
from .whole_streams import response_events

__all__ = [
    "RESPONSES",
    "ResponsesCodec",
    "ResponsesRound",
    "ResponsesRules",
    "check",
    "event",
    "failure",
    "read",
    "reply",
    "responses_messages",
    "usage",
    "usage_of",
]

Item = dict[str, Any]


class ResponsesRequest(msgspec.Struct):
    """What the proxy reads of a request; items stay plain dicts, so fields it does not model survive."""

    input: str | list[Item] = []
    instructions: str | None = None
    model: str | None = None
    stream: bool = False
    tools: list[Item] | None = None
    # State the proxy cannot see: such a request goes through untouched.
    previous_response_id: str | None = None
    conversation: Any = None
    prompt: Any = None
    background: bool | None = None


_DECODER = msgspec.json.Decoder(ResponsesRequest)
STATEFUL = ("previous_response_id", "conversation", "prompt", "background")


def read(body: bytes) -> Reading:
    request: ResponsesRequest = decode_json(body, _DECODER.decode, "Responses request")
    finite_fields(body, ("input",), "Responses request")
    untouched = next((field for field in STATEFUL if getattr(request, field)), None)
    items = request.input if isinstance(request.input, list) else []
    if untouched is None and any(item.get("type") == "item_reference" for item in items):
        untouched = "item_reference"
    messages = [] if untouched else responses_messages(request.instructions, request.input)
    return Reading(messages, request.stream, untouched, {"input": request.input}, request.model)


# -- the upstream's answers --------------------------------------------------------------


class _Content(msgspec.Struct):
    type: str = ""
    text: str | None = None


class _Item(msgspec.Struct):
    type: str = ""
    content: list[_Content] | None = None


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None


class _Response(msgspec.Struct):
    output: list[_Item]
    usage: _Usage | None = None


def check(body: bytes) -> dict[str, Any]:
    return checked(body, _Response, "a response", "upstream_bad_response")


def reply(response: dict[str, Any]) -> WorkerReply:
    """A response's text and tool calls, as the rounds read them."""
    output = response.get("output") or []
    text = "".join(
        part.get("text") or "" for item in output if item.get("type") == "message" for part in item.get("content") or () if part.get("type") == "output_text"
    )
    return WorkerReply(text=text, tool_calls=[call for item in output if (call := item_call(item))])


def item_call(item: Item) -> dict[str, Any] | None:
    """An output item that calls a tool, as a chat tool call."""
    kind = item.get("type")
    if kind not in ("function_call", "custom_tool_call"):
        return None
    arguments = item.get("arguments") if kind == "function_call" else item.get("input")
    return function_call(str(item.get("call_id") or ""), str(item.get("name") or ""), text_of(arguments))


def usage(total: Usage, response: dict[str, Any]) -> None:
    said = response.get("usage")
    details = said.get("input_tokens_details") if isinstance(said, dict) else None
    reasoning = count_of(said.get("output_tokens_details") if isinstance(said, dict) else None, "reasoning_tokens")
    total.add_counts(count_of(said, "input_tokens"), count_of(said, "output_tokens"), reasoning_tokens=reasoning)
    if isinstance(details, dict) and "cached_tokens" in details:
        total.read_from_cache(count_of(details, "cached_tokens"))


def usage_of(usage: Usage) -> dict[str, Any]:
    """The answering call's usage (``Usage.answer``), as a response's ``usage``."""
    usage = usage.answer()
    return {
        "input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
        "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": usage.more.get("reasoning_tokens", 0)},
        "total_tokens": usage.total_tokens,
    }  # fmt: skip


def message_item(item_id: str, text: str, status: str = "completed") -> Item:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [output_text(text)]}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


ENDED = ("response.completed", "response.incomplete")


def event(kind: str, payload: dict[str, Any]) -> bytes:
    return named_event(kind, {"type": kind, **payload})


def failure(error: PcpError) -> bytes:
    return event("error", {"code": error.body.code, "message": error.body.message, "param": error.body.param, "sequence_number": 0})


class _Event(msgspec.Struct):
    type: str
    output_index: int = 0
    response: dict[str, Any] | None = None
    item: dict[str, Any] | None = None


def whole(body: bytes) -> list[dict[str, Any]]:
    """A response that came whole where a stream was asked for, as its events (``whole_streams``)."""
    return list(response_events(check(body)))


def as_stream(body: bytes) -> bytes:
    """A response that came whole, as the event stream the client asked for."""
    return b"".join(named_event(e["type"], e) for e in whole(body))


class ResponsesRules:
    """A Responses stream is whole when it ends with ``response.completed`` (or ``response.incomplete``);
    an ``error`` or ``response.failed`` event is the upstream's failure."""

    whole = staticmethod(whole)

    def __init__(self) -> None:
        self.done = False
        self.ended = False

    @staticmethod
    def check(data: bytes) -> dict[str, Any]:
        return checked(data, _Event, "a Responses stream event", "upstream_bad_stream")

    def failure(self, event: dict[str, Any]) -> str | None:
        kind = event["type"]
        if kind == "error":
            return said(event)
        if kind == "response.failed":
            response = event.get("response")
            return said((response.get("error") if isinstance(response, dict) else None) or "the response failed")
        self.ended = self.ended or kind in ENDED
        return None

    def missing(self) -> str | None:
        return None if self.ended else "no response.completed (cut short?)"


# -- the codec ---------------------------------------------------------------------------


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
        # Not strict: the directives' schemas leave additionalProperties open.
        return {"type": "function", "name": function["name"], "description": function["description"], "parameters": function["parameters"], "strict": False}


def new_item_id() -> str:
    return f"msg_pcp{short_hash(str(time.time_ns()))}"


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
        self.sequence = 0
        self.item_id = new_item_id()

    # -- reading the upstream's events -------------------------------------------------
    def read(self, event: dict[str, Any]) -> str:
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
        return event(kind, {"sequence_number": self.sequence - 1, **fields})

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
