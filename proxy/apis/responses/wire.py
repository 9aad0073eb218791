"""OpenAI's Responses API on the wire: the request the proxy reads, the answers and events it checks, and writes.

Only the stateless form is paged: a request that leans on state the proxy
cannot see (``previous_response_id``, ``conversation``, a stored ``prompt``, an
``item_reference``, ``background``) goes through untouched, whatever its size.
A response that came whole where a stream was asked for (a server that
ignores ``stream``) is written as the events the provider itself sends, in
its order: ``response.created``, ``response.in_progress``, each output item
added, its content or arguments as one delta, done, then
``response.completed`` (``incomplete``, ``failed``) with the response.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec

from pcp_core import WorkerReply, short_hash

from ...decoding import decode_json, finite_fields
from ...errors import PcpError
from ...sse import error_message, named_event, typed_event
from ..codec import Reading, Usage, checked, count_of, function_call, text_of
from .conversation import responses_messages

__all__ = [
    "ENDED",
    "STATEFUL",
    "ResponsesRequest",
    "ResponsesRules",
    "as_stream",
    "check",
    "failure",
    "item_call",
    "ResponseStream",
    "message_item",
    "new_item_id",
    "output_text",
    "read",
    "reply",
    "response_events",
    "usage",
    "usage_of",
]

Item = dict[str, Any]
Event = dict[str, Any]
# What makes a request lean on state the upstream keeps.
STATEFUL = ("previous_response_id", "conversation", "prompt", "background")


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


def read(body: bytes) -> Reading:
    """A Responses request's body as a ``Reading``, or the 400 that says what is wrong with it."""
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
    """A response decoded, once it has the shape the proxy reads (else the 502 that says where)."""
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
    """Add a response's usage to the request's: its input, output and reasoning tokens, and what its cache served."""
    counts = response.get("usage")
    details = counts.get("input_tokens_details") if isinstance(counts, dict) else None
    reasoning = count_of(counts.get("output_tokens_details") if isinstance(counts, dict) else None, "reasoning_tokens")
    total.add_counts(count_of(counts, "input_tokens"), count_of(counts, "output_tokens"), reasoning_tokens=reasoning)
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
    """An assistant message item that says ``text``."""
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [output_text(text)]}


def output_text(text: str) -> dict[str, Any]:
    """``text`` as an ``output_text`` part."""
    return {"type": "output_text", "text": text, "annotations": []}


ENDED = ("response.completed", "response.incomplete")


def failure(error: PcpError) -> bytes:
    """A failure once a stream has started, as the Responses API tells it: an ``error`` event."""
    return typed_event("error", code=error.body.code, message=error.body.message, param=error.body.param, sequence_number=0)


class ResponseStream:
    """The events of one response's stream as they are written: each numbered by its ``sequence_number``, and a
    message's written alike by protocol mode's round and by the translation of a chat stream."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        """The stream's next event."""
        self.sequence += 1
        return typed_event(kind, sequence_number=self.sequence - 1, **fields)

    def started(self, response: dict[str, Any]) -> bytes:
        """``response.created`` and ``response.in_progress``: the first events of the stream."""
        return self("response.created", response=response) + self("response.in_progress", response=response)

    def message_added(self, index: int, item_id: str) -> bytes:
        """A message item added at output ``index``, and its text part: what comes before its text."""
        item = {**message_item(item_id, "", "in_progress"), "content": []}
        added = self("response.output_item.added", output_index=index, item=item)
        return added + self("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=output_text(""))

    def text_delta(self, index: int, item_id: str, text: str) -> bytes:
        """A piece of the message's text."""
        return self("response.output_text.delta", item_id=item_id, output_index=index, content_index=0, delta=text, logprobs=[])

    def message_done(self, index: int, item_id: str, text: str, status: str = "completed") -> tuple[list[bytes], Item]:
        """The ``…done`` events of a message that says ``text``, and its item."""
        item, place = message_item(item_id, text, status), {"item_id": item_id, "output_index": index, "content_index": 0}
        done = [
            self("response.output_text.done", **place, text=text, logprobs=[]),
            self("response.content_part.done", **place, part=output_text(text)),
            self("response.output_item.done", output_index=index, item=item),
        ]
        return done, item


class _Event(msgspec.Struct):
    type: str
    output_index: int = 0
    response: dict[str, Any] | None = None
    item: dict[str, Any] | None = None


def whole(body: bytes) -> list[dict[str, Any]]:
    """A response that came whole where a stream was asked for, as its events (``response_events``)."""
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
        """One event decoded, once it has the shape the proxy reads (else the 502 that says where)."""
        return checked(data, _Event, "a Responses stream event", "upstream_bad_stream")

    def failure(self, event: dict[str, Any]) -> str | None:
        """The upstream's error, if ``event`` is one (or ``response.failed``); else None, and the response's end noted."""
        kind = event["type"]
        if kind == "error":
            return error_message(event)
        if kind == "response.failed":
            response = event.get("response")
            return error_message((response.get("error") if isinstance(response, dict) else None) or "the response failed")
        self.ended = self.ended or kind in ENDED
        return None

    def missing(self) -> str | None:
        """What the stream lacks to be whole: its ``response.completed``."""
        return None if self.ended else "no response.completed (cut short?)"


def new_item_id() -> str:
    """A new item id of the proxy's own."""
    return f"msg_pcp{short_hash(str(time.time_ns()))}"


def response_events(response: dict[str, Any]) -> Iterator[Event]:
    """A response object as the events of its stream, numbered by ``sequence_number``."""
    sequence = iter(range(1 << 31))

    def event(kind: str, **fields: Any) -> Event:
        """The stream's next event, numbered."""
        return {"type": kind, "sequence_number": next(sequence), **fields}

    opened = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=opened)
    yield event("response.in_progress", response=opened)
    for index, item in enumerate(response.get("output") or ()):
        yield from _item_events(event, index, item)
    status = response.get("status") if response.get("status") in ("incomplete", "failed") else "completed"
    yield event(f"response.{status}", response=response)


def _item_events(event: Any, index: int, item: dict[str, Any]) -> Iterator[Event]:
    """One output item as the events that stream it: added, its content or arguments as one delta, done."""
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
        arguments = item.get(field) or ""
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", field: ""})
        yield event(f"response.{name}.delta", **at, delta=arguments)
        yield event(f"response.{name}.done", **at, **{field: arguments})
    else:  # reasoning, a hosted tool's call: whole when added
        yield event("response.output_item.added", output_index=index, item=item)
    yield event("response.output_item.done", output_index=index, item=item)
