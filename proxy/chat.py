"""The chat-completions API: what the proxy reads of a request, and how it speaks to both sides in protocol mode.

Only what the proxy needs is decoded; the rest of a request stays as the
client sent it and goes upstream with each worker call.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec

from pcp_core import CallWorker, Outcome, WorkerReply, spoken

from .errors import ClientError

__all__ = ["ChatCodec", "ChatRequest", "Usage", "parse_chat_request", "sse_event"]


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


_DECODER = msgspec.json.Decoder(ChatRequest)


def parse_chat_request(body: bytes) -> ChatRequest:
    try:
        request = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        raise ClientError(f"invalid chat request: {text}", param=_param(text)) from None
    except msgspec.DecodeError as exc:
        raise ClientError(f"request body is not valid JSON: {exc}") from None
    for i, message in enumerate(request.messages):
        if not isinstance(message.get("role"), str):
            raise ClientError(f"messages[{i}] has no role", param=f"messages.[{i}].role")
    return request


# msgspec ends a message with where it failed: "… - at `$.messages[0].role`".
_AT = re.compile(r"at `\$\.([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def _param(message: str) -> str | None:
    """The field a validation error is about, written as OpenAI writes ``param`` (``messages.[0].role``)."""
    at = _AT.search(message) or _MISSING.search(message)
    return at.group(1).replace("[", ".[") if at else None


class Usage(msgspec.Struct):
    """Tokens of every upstream call made for one request, summed."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # The prompt tokens the upstream's prompt cache served, summed, when it says (OpenAI, vLLM, llama.cpp).
    cached_tokens: int | None = None

    def add(self, usage: dict[str, Any] | None) -> None:
        for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
            setattr(self, field, getattr(self, field) + int((usage or {}).get(field) or 0))
        details = (usage or {}).get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(cached, int):
            self.cached_tokens = (self.cached_tokens or 0) + cached

    def as_dict(self) -> dict[str, Any]:
        """The usage as the API writes it (``prompt_tokens_details.cached_tokens`` when the upstream gave one)."""
        usage: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": self.total_tokens}
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage


# Fields of the client's request that the proxy sets itself on worker calls.
OWN_FIELDS = ("messages", "stream", "stream_options", "n", "tools", "tool_choice")


class ChatCodec:
    """One chat-completions request in protocol mode: its worker calls, and the answer it gets."""

    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.client_tools: list[dict[str, Any]] = list(body.get("tools") or [])
        self.choices: int = body.get("n") or 1  # answers the client asked for (checked when the body was read)
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
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
        return json.dumps(body).encode()

    @staticmethod
    def reply(completion: dict[str, Any]) -> WorkerReply:
        message = completion["choices"][0]["message"]
        return WorkerReply(text=message.get("content") or "", tool_calls=message.get("tool_calls") or [])

    def final(self, completion: dict[str, Any], outcome: Outcome, usage: Usage) -> dict[str, Any]:
        """The completion the client gets: the answer (with ``n``, one per choice), the usage of every call."""
        if outcome.kind == "answer":
            first, *others = completion["choices"]
            answers = [(first, outcome.text), *((choice, spoken(choice["message"].get("content") or "")) for choice in others[: self.choices - 1])]
            completion["choices"] = [_answer(choice, i, text) for i, (choice, text) in enumerate(answers)]
        completion["usage"] = usage.as_dict()
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


DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _answer(choice: dict[str, Any], index: int, text: str) -> dict[str, Any]:
    finish = choice.get("finish_reason")
    return {**choice, "index": index, "message": {"role": "assistant", "content": text}, "finish_reason": "stop" if finish in (None, "tool_calls") else finish}
