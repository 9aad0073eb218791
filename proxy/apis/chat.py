"""The chat-completions API: what the proxy reads of a request, and how it speaks to both sides in protocol mode (``codec``).

Only what the proxy needs is decoded; the rest of a request stays as the
client sent it and goes upstream with each worker call.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, Any, TypeVar

import msgspec

from pcp_core import CallWorker, ComponentSpec, Outcome, WorkerReply, short_hash, spoken

from ..errors import ClientError, PcpError
from ..sse import ChatRules, error_event
from ..upstream import check_chunk, check_completion

__all__ = ["ChatCodec", "ChatRequest", "ChatRound", "Usage", "decode_json", "error_param", "parse_chat_request", "relayed_finish", "sse_event"]

T = TypeVar("T")


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
    # PACT components the request attaches to its session (``proxy.components``): the proxy's, never forwarded.
    pcp_components: list[ComponentSpec] | None = None


_DECODER = msgspec.json.Decoder(ChatRequest)


def parse_chat_request(body: bytes) -> ChatRequest:
    request: ChatRequest = decode_json(body, _DECODER.decode)
    for i, message in enumerate(request.messages):
        if not isinstance(message.get("role"), str):
            raise ClientError(f"messages[{i}] has no role", param=f"messages.[{i}].role")
    return request


def decode_json(body: bytes, decode: Callable[[bytes], T], what: str = "chat request") -> T:
    """``decode(body)``, or the 400 that says what is wrong with the body.

    Besides what is not JSON or not of the API's shape, msgspec refuses text
    that is not UTF-8 and raises RecursionError past some thousand levels of
    nesting: both are the request's fault, not the proxy's.
    """
    try:
        return decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        raise ClientError(f"invalid {what}: {text}", param=error_param(text)) from None
    except msgspec.DecodeError as exc:
        raise ClientError(f"request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError:
        raise ClientError(f"request body is not valid UTF-8 ({_bad_utf8(body)})", code="invalid_encoding") from None
    except RecursionError:
        raise ClientError("request body is nested too deeply: JSON arrays and objects within each other, a thousand levels or so", code="too_deep") from None


def _bad_utf8(body: bytes) -> str:
    try:
        body.decode()
    except UnicodeDecodeError as exc:
        return f"byte 0x{body[exc.start]:02x} at offset {exc.start}"
    return "in a string"  # not reached: msgspec found what Python finds


# msgspec ends a message with where it failed: "… - at `$.messages[0].role`".
_AT = re.compile(r"at `\$\.([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def error_param(message: str) -> str | None:
    """The field a validation error is about, written as OpenAI writes ``param`` (``messages.[0].role``)."""
    at = _AT.search(message) or _MISSING.search(message)
    return at.group(1).replace("[", ".[") if at else None


class Usage(msgspec.Struct):
    """Tokens of every upstream call made for one request, summed."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # Counts another API tells that chat has no name for (Anthropic's cache reads and writes), summed by name.
    more: dict[str, int] = {}
    # The prompt tokens the upstream's prompt cache served, summed, when it says (OpenAI, vLLM, llama.cpp).
    cached_tokens: int | None = None

    def add(self, usage: dict[str, Any] | None) -> None:
        """Add a chat completion's usage."""
        for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
            setattr(self, field, getattr(self, field) + int((usage or {}).get(field) or 0))
        details = (usage or {}).get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(cached, int):
            self.cached_tokens = (self.cached_tokens or 0) + cached

    def add_counts(self, prompt: int, completion: int, **more: int) -> None:
        """Add another API's usage: the tokens it read and wrote, and what else it counts."""
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens += prompt + completion
        for name, tokens in more.items():
            self.more[name] = self.more.get(name, 0) + tokens

    def chat(self) -> dict[str, Any]:
        """The sum as a chat completion's ``usage`` (``prompt_tokens_details.cached_tokens`` when the upstream gave one)."""
        usage: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": self.total_tokens}
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage


# Fields of the client's request that the proxy sets itself on worker calls.
OWN_FIELDS = ("messages", "stream", "stream_options", "n", "tools", "tool_choice", "pcp_components")


class ChatCodec:
    """One chat-completions request in protocol mode: its worker calls, and the answer it gets."""

    api = "chat"
    path = "/chat/completions"
    check = staticmethod(check_completion)

    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.client_tools: list[dict[str, Any]] = list(body.get("tools") or [])
        self.choices: int = body.get("n") or 1  # answers the client asked for (checked when the body was read)
        self.streamed = bool(body.get("stream"))
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.components = body.get("pcp_components")
        self.base = {k: v for k, v in body.items() if k not in OWN_FIELDS}

    @property
    def model(self) -> str:
        return str(self.body.get("model") or "")

    def worker_body(self, call: CallWorker, stream: bool) -> bytes:
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
        return json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}).encode()

    @staticmethod
    def rules() -> ChatRules:
        return ChatRules(check_chunk)

    @staticmethod
    def reply(completion: dict[str, Any]) -> WorkerReply:
        message = completion["choices"][0]["message"]
        return WorkerReply(text=message.get("content") or "", tool_calls=message.get("tool_calls") or [])

    @staticmethod
    def count(usage: Usage, completion: dict[str, Any]) -> None:
        usage.add(completion.get("usage"))

    def final(self, completion: dict[str, Any], outcome: Outcome, usage: Usage) -> dict[str, Any]:
        """The completion the client gets: the answer (with ``n``, one per choice), the usage of every call."""
        if outcome.kind == "answer":
            first, *others = completion["choices"]
            answers = [(first, outcome.text), *((choice, spoken(choice["message"].get("content") or "")) for choice in others[: self.choices - 1])]
            completion["choices"] = [_answer(choice, i, text) for i, (choice, text) in enumerate(answers)]
        completion["usage"] = usage.chat()
        return completion

    async def events(self, completion: dict[str, Any]) -> AsyncIterator[bytes]:
        """A whole completion as the stream of chunks that would have carried it."""
        meta = {"id": completion.get("id", ""), "object": "chat.completion.chunk", "created": completion.get("created", int(time.time())), "model": completion.get("model", "")}
        for n, choice in enumerate(completion["choices"]):
            message = choice["message"]
            delta = {"role": "assistant", "content": message.get("content")}
            if message.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            for part, finish in ((delta, None), ({}, choice.get("finish_reason") or "stop")):
                yield sse_event({**meta, "choices": [{"index": choice.get("index", n), "delta": part, "finish_reason": finish}]})
        if self.include_usage:
            yield sse_event({**meta, "choices": [], "usage": completion["usage"]})
        yield DONE

    def round(self, usage: Usage) -> ChatRound:
        return ChatRound(self.model, usage, self.include_usage)


class ChatRound:
    """One streamed worker call of the chat API: its chunks read, the client's chunks written."""

    def __init__(self, model: str, usage: Usage, include_usage: bool):
        self.usage = usage
        self.include_usage = include_usage
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None  # why the upstream says the round ended
        self.meta = {"id": f"chatcmpl-pcp{short_hash(str(time.time_ns()))}", "model": model, "created": int(time.time())}

    def read(self, event: dict[str, Any]) -> str:
        self.usage.add(event.get("usage"))
        self.meta.update({k: event[k] for k in ("id", "model", "created") if k in event})
        text = ""
        for choice in event.get("choices") or ():
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or {}
            self._collect_tool_calls(delta.get("tool_calls") or ())
            text += delta.get("content") or ""
        return text

    def _collect_tool_calls(self, deltas: Any) -> None:
        for delta in deltas:
            call = self.tool_calls.setdefault(delta.get("index", 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] = delta.get("id") or call["id"]
            function = delta.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def calls(self) -> list[dict[str, Any]]:
        return list(self.tool_calls.values())

    def opening(self) -> bytes:
        return self.chunk({"role": "assistant", "content": ""})

    def text(self, text: str) -> bytes:
        return self.chunk({"content": text})

    @staticmethod
    def failure(error: PcpError) -> bytes:
        return error_event(error)

    def closing(self) -> Iterator[bytes]:
        yield self.chunk({}, finish_reason=relayed_finish(self.finish_reason))
        yield from self.ending()

    async def replay(self, events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """The round as the upstream sent it, but for the usage the proxy asked it for (``ending`` tells the sum)."""
        for event in events:
            if event.get("choices") or not event.get("usage"):
                yield self.event({k: v for k, v in event.items() if k != "usage"})
        for event in self.ending():
            yield event

    def ending(self) -> Iterator[bytes]:
        """What follows an answer's last chunk: the usage of every upstream call, when the client asked for it; [DONE]."""
        if self.include_usage:
            yield self.event({"choices": [], "usage": self.usage.chat()})
        yield DONE

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return self.event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

    def event(self, payload: dict[str, Any]) -> bytes:
        return sse_event({**self.meta, "object": "chat.completion.chunk", **payload})


DONE = b"data: [DONE]\n\n"
_ENCODER = msgspec.json.Encoder()


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def relayed_finish(finish: str | None) -> str:
    """The finish reason of the round that answered, as the client gets it: its own (``length``,
    ``content_filter``), but "stop" where the round's tool calls were directives, taken out of the answer."""
    return "stop" if finish in (None, "tool_calls") else finish


def _answer(choice: dict[str, Any], index: int, text: str) -> dict[str, Any]:
    return {**choice, "index": index, "message": {"role": "assistant", "content": text}, "finish_reason": relayed_finish(choice.get("finish_reason"))}
