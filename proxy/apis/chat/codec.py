"""The chat-completions API: what the proxy reads of a request, and how it speaks to both sides in protocol mode.

Only what the proxy needs is decoded; the rest of a request stays as the
client sent it and goes upstream with each worker call. A failure once a
stream has started is told as OpenAI-compatible servers tell it, an event
``data: {"error": {…}}`` with no ``[DONE]`` after it (the openai SDK raises
``APIError`` on it).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import msgspec

from pcp_core import CallWorker, ComponentSpec, Outcome, WorkerReply, short_hash, spoken

from ...decoding import decode_json, finite_fields
from ...errors import ClientError, PcpError
from ...sse import DONE, data_event, error_message
from ..codec import Api, BodyCodec, Reading, Usage, checked
from .chunks import chat_chunks, collect_tool_calls

__all__ = ["CHAT", "ChatCodec", "ChatRequest", "ChatRound", "ChatRules", "check", "check_chunk", "event", "failure", "read", "relayed_finish"]


class ToolFunction(msgspec.Struct):
    name: str


class Tool(msgspec.Struct):
    function: ToolFunction | None = None  # a tool of another type (a custom tool) has none


class ChatRequest(msgspec.Struct):
    """What the proxy reads of a request; validating it here turns a wrong type into a 400, not a failure later.

    Only the types are checked: the request goes upstream as the client sent it.
    """

    # Messages stay plain dicts: fields the proxy does not model must survive.
    messages: list[dict[str, Any]]
    stream: bool = False
    model: str | None = None
    # Read in protocol mode: the client's own tools end the round loop when called,
    # ``include_usage`` asks for the usage chunk of a stream, ``n`` for several answers.
    tools: list[Tool] | None = None
    stream_options: dict[str, Any] | None = None
    n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # PACT components the request attaches to its session (``proxy.pact``): the proxy's, never forwarded.
    pcp_components: list[ComponentSpec] | None = None


_DECODER = msgspec.json.Decoder(ChatRequest)


def read(body: bytes) -> Reading:
    """A chat request's body as a ``Reading``, or the 400 that says what is wrong with it."""
    request: ChatRequest = decode_json(body, _DECODER.decode)
    finite_fields(body, ("messages",), "chat request")
    for i, message in enumerate(request.messages):
        if not isinstance(message.get("role"), str):
            raise ClientError(f"messages[{i}] has no role", param=f"messages.[{i}].role")
    return Reading(request.messages, request.stream, None, {"messages": request.messages}, request.model, request.pcp_components)


# -- the upstream's answers --------------------------------------------------------------
# Checked against these shapes before they are read, so a malformed one is a 502 that says
# what was wrong where, not a failure inside the proxy. Fields not named are not checked.


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: Any = None  # a JSON string by the API; anything else reads as a malformed directive


class _ToolCall(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: _Function = msgspec.field(default_factory=_Function)


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Completion(msgspec.Struct):
    choices: Annotated[list[_Choice], msgspec.Meta(min_length=1)]
    usage: _Usage | None = None


class _ChunkChoice(msgspec.Struct):
    delta: _Message = msgspec.field(default_factory=_Message)


class _Chunk(msgspec.Struct):
    choices: list[_ChunkChoice] | None = None
    usage: _Usage | None = None


def check(body: bytes) -> dict[str, Any]:
    """A chat completion decoded, once it has the shape the proxy reads (else the 502 that says where)."""
    return checked(body, _Completion, "a chat completion", "upstream_bad_response")


def check_chunk(data: bytes) -> dict[str, Any]:
    """A chunk of a chat stream decoded, once it has the shape the proxy reads (else the 502 that says where)."""
    return checked(data, _Chunk, "a chat completion chunk", "upstream_bad_stream")


def reply(completion: dict[str, Any]) -> WorkerReply:
    """A completion's first choice as the rounds read it: its text and tool calls."""
    message = completion["choices"][0]["message"]
    return WorkerReply(text=message.get("content") or "", tool_calls=message.get("tool_calls") or [])


def usage(total: Usage, completion: dict[str, Any]) -> None:
    """Add a completion's usage to the request's."""
    total.add(completion.get("usage"))


def whole(body: bytes) -> list[dict[str, Any]]:
    """A completion that came whole where a stream was asked for, as its chunks (``chat_chunks``)."""
    return list(chat_chunks(check(body)))


def as_stream(body: bytes) -> bytes:
    """A completion that came whole, as the event stream the client asked for."""
    return b"".join(map(event, whole(body))) + DONE_EVENT


class ChatRules:
    """A streamed chat completion is whole when it carried at least one choice and
    ended with ``[DONE]`` or a ``finish_reason``."""

    check = staticmethod(check_chunk)
    whole = staticmethod(whole)

    def __init__(self) -> None:
        self.choices = False  # an event carried a choice
        self.finished = False  # a choice carried its finish_reason
        self.done = False  # [DONE] came

    def failure(self, chunk: dict[str, Any]) -> str | None:
        """What the upstream says went wrong, if ``chunk`` is an error; else None, and its choices are taken in."""
        if "error" in chunk and not chunk.get("choices"):
            return error_message(chunk["error"])
        for choice in chunk.get("choices") or ():
            self.choices = True
            self.finished = self.finished or bool(isinstance(choice, dict) and choice.get("finish_reason"))
        return None

    def missing(self) -> str | None:
        """What the stream lacks to be whole (None: nothing)."""
        if self.choices and (self.done or self.finished):
            return None
        return "no finish_reason and no [DONE] (cut short?)" if self.choices else "no event carried a choice"


# -- the client's answer -----------------------------------------------------------------

DONE_EVENT = data_event(DONE)


def event(payload: dict[str, Any]) -> bytes:
    """One chunk as a server-sent event."""
    return data_event(json.dumps(payload).encode())


def failure(error: PcpError) -> bytes:
    """A failure once a stream has started: an ``error`` event, and no ``[DONE]`` after it."""
    return data_event(error.envelope())


def relayed_finish(finish: str | None) -> str:
    """The finish reason of the round that answered, as the client gets it: its own (``length``,
    ``content_filter``), but "stop" where the round's tool calls were directives, taken out of the answer."""
    return "stop" if finish in (None, "tool_calls") else finish


# Fields of the client's request that the proxy sets itself on worker calls.
OWN_FIELDS = ("messages", "stream", "stream_options", "n", "tools", "tool_choice", "pcp_components")


class ChatCodec(BodyCodec):
    """One chat-completions request in protocol mode: its worker calls, and the answer it gets."""

    check = staticmethod(check)
    reply = staticmethod(reply)
    usage = staticmethod(usage)
    rules = ChatRules

    def __init__(self, body: dict[str, Any]):
        self.api = CHAT
        self.body = body
        self.client_tools: list[dict[str, Any]] = list(body.get("tools") or [])
        self.choices: int = body.get("n") or 1  # answers the client asked for (checked when the body was read)
        self.streamed = bool(body.get("stream"))
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.components = body.get("pcp_components")
        self.base = {k: v for k, v in body.items() if k not in OWN_FIELDS}

    def worker_body(self, call: CallWorker, stream: bool) -> bytes:
        """A worker call as a chat completion's body: the client's fields, the call's messages and tools."""
        body = {**self.base, "messages": call.messages}
        if call.tools:
            body["tools"] = call.tools
            if self.client_tools and "tool_choice" in self.body:
                body["tool_choice"] = self.body["tool_choice"]
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        elif self.choices > 1:
            body["n"] = self.choices  # choice 0 leads the rounds; the others answer with it (``final``)
        return _ENCODER.encode(body)  # fields the proxy does not read are msgspec.Raw: sent as the client wrote them

    @staticmethod
    def router_body(messages: list[dict[str, Any]], model: str, max_tokens: int) -> bytes:
        """A call of the router model: its messages, and no more than ``max_tokens``, at temperature 0."""
        return json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()

    def final(self, completion: dict[str, Any], outcome: Outcome, usage: Usage) -> dict[str, Any]:
        """The completion the client gets: the answer (with ``n``, one per choice), the answering call's usage."""
        if outcome.kind == "answer":
            first, *others = completion["choices"]
            answers = [(first, outcome.text), *((choice, spoken(choice["message"].get("content") or "")) for choice in others[: self.choices - 1])]
            completion["choices"] = [_answer(choice, i, text) for i, (choice, text) in enumerate(answers)]
        completion["usage"] = usage.chat()
        return completion

    async def events(self, completion: dict[str, Any]) -> AsyncIterator[bytes]:
        """A whole completion as the stream of chunks that would have carried it."""
        for chunk in chat_chunks(completion, usage=self.include_usage):
            yield event(chunk)
        yield DONE_EVENT

    def round(self, usage: Usage) -> ChatRound:
        """One streamed worker call, read and written as chat chunks."""
        return ChatRound(self.model, usage, self.include_usage)


class ChatRound:
    """One streamed worker call of the chat API: its chunks read, the client's chunks written."""

    failure = staticmethod(failure)

    def __init__(self, model: str, usage: Usage, include_usage: bool):
        self.usage = usage
        self.include_usage = include_usage
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None  # why the upstream says the round ended
        self.meta = {"id": f"chatcmpl-pcp{short_hash(str(time.time_ns()))}", "model": model, "created": int(time.time())}

    def read(self, event: dict[str, Any]) -> str:
        """Take in one upstream chunk: its usage, tool calls and finish reason; the answer text it adds."""
        self.usage.add(event.get("usage"))
        self.meta.update({k: event[k] for k in ("id", "model", "created") if k in event})
        text = ""
        for choice in event.get("choices") or ():
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or {}
            collect_tool_calls(self.tool_calls, delta.get("tool_calls") or ())
            text += delta.get("content") or ""
        return text

    def calls(self) -> list[dict[str, Any]]:
        """The round's tool calls so far, put together from their deltas."""
        return list(self.tool_calls.values())

    def opening(self) -> bytes:
        """The client's first chunk: the assistant's role."""
        return self.chunk({"role": "assistant", "content": ""})

    def text(self, text: str) -> bytes:
        """A chunk of the answer's text."""
        return self.chunk({"content": text})

    def closing(self) -> Iterator[bytes]:
        """The chunk with the relayed finish reason, then what ends the stream (``ending``)."""
        yield self.chunk({}, finish_reason=relayed_finish(self.finish_reason))
        yield from self.ending()

    async def replay(self, events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """The round as the upstream sent it, but for the usage the proxy asked it for (``ending`` tells the answering call's)."""
        for chunk in events:
            if chunk.get("choices") or not chunk.get("usage"):
                yield self.event({k: v for k, v in chunk.items() if k != "usage"})
        for tail in self.ending():
            yield tail

    def ending(self) -> Iterator[bytes]:
        """What follows an answer's last chunk: the answering call's usage, when the client asked for it; [DONE]."""
        if self.include_usage:
            yield self.event({"choices": [], "usage": self.usage.chat()})
        yield DONE_EVENT

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        """One chunk of the client's stream, of choice 0."""
        return self.event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

    def event(self, payload: dict[str, Any]) -> bytes:
        """A chunk of the client's stream, with the round's id, model and creation time."""
        return event({**self.meta, "object": "chat.completion.chunk", **payload})


_ENCODER = msgspec.json.Encoder()


def _answer(choice: dict[str, Any], index: int, text: str) -> dict[str, Any]:
    """A choice of the client's completion: ``text`` as its message."""
    return {**choice, "index": index, "message": {"role": "assistant", "content": text}, "finish_reason": relayed_finish(choice.get("finish_reason"))}


# The fields chat's protocol mode reads; every other one goes upstream as the bytes the client sent.
READ_FIELDS = frozenset({"stream", "model", "tools", "stream_options", "n", "pcp_components"})

CHAT = Api("chat", "/chat/completions", READ_FIELDS, read, ChatCodec, failure, chat_body=True, as_stream=as_stream)
