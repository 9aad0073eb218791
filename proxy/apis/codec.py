"""What every paged API gives the routes and the one loop of protocol mode: an ``Api``, a codec per request, a round stream per streamed call.

Three APIs are paged: chat completions (``chat``), OpenAI's Responses
(``responses``) and Anthropic's Messages (``messages``). Each is one package,
with the same names for the same jobs:

* ``read`` — a request's body as a ``Reading``: its conversation as chat messages
  (``pcp_core.chat_messages``) for the rules, or the 400 that says what is wrong;
* ``check`` — an upstream answer decoded, once it has the shape the proxy reads;
* ``reply`` — an answer as the rounds read it (``WorkerReply``);
* ``usage`` — an answer's usage added to the request's (``Usage``);
* ``Rules`` — what makes the API's stream whole (``sse.StreamRules``);
* ``Round`` — one streamed worker call: its events read, the client's written;
* ``failure`` — an error once a stream has started, as the API tells it.

Responses and Messages also carry their translation to chat completions
(``chat_request``, ``chat_answer``), which ``translation`` puts in front of an
upstream that speaks only chat.

A codec turns the rounds' worker calls (chat messages: the ``<PagedContext>`` as
system text, a user line with its parts) into calls of its own API and writes
the client's answer in its API's shape. Everything else (sessions, paging,
rounds, the answer gate, deadlines) is the loop's and the same for every API.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from pcp_core import CallWorker, Outcome, WorkerReply, message_text

from ..decoding import decode_json
from ..errors import PcpError, UpstreamError
from ..sse import StreamRules

__all__ = [
    "Api",
    "Codec",
    "Reading",
    "RoundStream",
    "ToolsCodec",
    "Usage",
    "checked",
    "count_of",
    "directive_tools",
    "function_call",
    "split_system",
    "text_of",
    "tools_text",
    "whole_body",
]

Check = Callable[[bytes], dict[str, Any]]
Failure = Callable[[PcpError], bytes]


class Reading(msgspec.Struct, frozen=True):
    """What a route reads of a request before it decides how to serve it."""

    messages: list[dict[str, Any]]  # the conversation as chat messages, its head first: what the Sentry measures
    stream: bool = False
    unreadable: str | None = None  # why it goes through untouched whatever its size (state the proxy cannot see)
    decoded: dict[str, Any] = {}  # fields already decoded, which the codec's body reuses
    model: str | None = None  # the model asked for: its settings (``[models."…"]``) apply
    components: list[Any] | None = None  # PACT components the request carries inline (chat's ``pcp_components``)
    # The body less the messages a body read before held (``known_bodies``): its other fields, read from here
    # (a few kB, not the whole history again); None: the body itself.
    rest: bytes | None = None


@dataclass(frozen=True)
class Api:
    """One paged API, as the routes and the loop meet it."""

    name: str  # "chat", "responses", "messages"
    path: str  # below the upstream's base URL
    read_fields: frozenset[str]  # the fields the codec reads; the others go upstream as the client sent them
    read: Callable[[bytes], Reading]  # the request read, or the 400 that says what is wrong with it
    codec: Callable[[dict[str, Any]], Codec]
    failure: Failure  # a failure midway through a stream, as the API tells it
    # Its bodies and answers are chat's: PACT components and Hybrid mode edit them below the
    # threshold, Hybrid mode reads its answers, and memory keeps what a forwarded one answered.
    chat_body: bool = False
    # An answer that came whole where a stream was asked for, as the event stream the client asked for (each API's ``as_stream``).
    as_stream: Callable[[bytes], bytes] | None = None


class Usage(msgspec.Struct):
    """Tokens of every upstream call made for one request, summed; and, from its ``mark``, the answering call's.

    What the client reads is the answering call's (``answer``): the context its answer was read from, which
    is what a coding agent measures against its own compaction threshold (the sum of a request's rounds is
    not a context and would push it to compact). The sum is what the proxy's telemetry prices."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # Counts another API tells that chat has no name for (Anthropic's cache reads and writes), summed by name.
    more: dict[str, int] = {}
    # The prompt tokens the upstream's prompt cache served, summed, when it says (OpenAI, vLLM, llama.cpp).
    cached_tokens: int | None = None
    # The sums as they were when the latest worker call began (``mark``); None: no call was marked.
    before: Usage | None = None

    def mark(self) -> None:
        """A worker call begins: what follows, until the next mark, is its usage."""
        self.before = Usage(self.prompt_tokens, self.completion_tokens, self.total_tokens, dict(self.more), self.cached_tokens)

    def answer(self) -> Usage:
        """The usage of the latest worker call (the one that answers; the whole sum where none was marked)."""
        before = self.before
        if before is None:
            return self
        more = {name: tokens - before.more.get(name, 0) for name, tokens in self.more.items()}
        cached = None if self.cached_tokens is None else self.cached_tokens - (before.cached_tokens or 0)
        return Usage(
            self.prompt_tokens - before.prompt_tokens,
            self.completion_tokens - before.completion_tokens,
            self.total_tokens - before.total_tokens,
            more,
            cached,
        )

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

    def cache_read(self) -> int | None:
        """The prompt tokens the upstream says its cache served, summed; None where it never told its count."""
        return self.cached_tokens

    def read_from_cache(self, tokens: int) -> None:
        """Add what an answer of another API says its cache served (its field for it was there)."""
        self.cached_tokens = (self.cached_tokens or 0) + tokens

    def chat(self) -> dict[str, Any]:
        """The answering call's usage (``answer``) as a chat completion's ``usage`` (``prompt_tokens_details.cached_tokens`` when the upstream gave one)."""
        self = self.answer()
        usage: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": self.total_tokens}
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage


class RoundStream(Protocol):
    """One streamed worker call: the upstream's events read, the client's written (in the codec's API)."""

    def read(self, event: dict[str, Any]) -> str:
        """Take in one upstream event; the answer text it adds."""

    def calls(self) -> list[dict[str, Any]]:
        """The round's tool calls so far, as chat tool calls (``{"id", "function": {"name", "arguments"}}``)."""

    def opening(self) -> bytes:
        """The client's first events, before the answer's text."""

    def text(self, text: str) -> bytes:
        """The events that carry ``text``, a piece of the answer the gate released."""

    def failure(self, error: PcpError) -> bytes:
        """A failure midway, as the API tells it in a stream."""

    def closing(self) -> Iterator[bytes]:
        """The events that end the client's stream."""

    def replay(self, events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """The round as the upstream sent it (a call of the client's own tools), with the request's usage."""


class Codec(Protocol):
    api: Api
    body: dict[str, Any]
    client_tools: list[dict[str, Any]]  # as chat tools: what the rounds read of the client's tools
    choices: int
    streamed: bool
    components: Any  # PACT components the request carries inline (chat's ``pcp_components``)

    @property
    def model(self) -> str:
        """The model the client asked for."""

    def worker_body(self, call: CallWorker, stream: bool) -> bytes:
        """A worker call as the API's request body (``stream``: asked as a stream)."""

    def router_body(self, messages: list[dict[str, Any]], model: str, max_tokens: int) -> bytes:
        """A call of the router model in the API's shape."""

    def check(self, body: bytes) -> dict[str, Any]:
        """An answer decoded, once it has the shape the proxy reads (else the 502 that says where)."""

    def rules(self) -> StreamRules:
        """What makes the API's stream whole (a new one per stream)."""

    def reply(self, data: dict[str, Any]) -> WorkerReply:
        """An answer as the rounds read it."""

    def usage(self, usage: Usage, data: dict[str, Any]) -> None:
        """Add the usage of one answer to the request's."""

    def final(self, data: dict[str, Any], outcome: Outcome, usage: Usage) -> dict[str, Any]:
        """The answer the client gets, from the answering call's ``data`` and the loop's ``outcome``."""

    def events(self, final: dict[str, Any]) -> AsyncIterator[bytes]:
        """A whole answer as the stream that would have carried it (chat's ``n`` > 1)."""

    def round(self, usage: Usage) -> RoundStream:
        """One streamed worker call: its events read, the client's written."""

    def cache_key(self, key: str) -> None:
        """Ask the upstream to route the request's calls by ``key`` (OpenAI's ``prompt_cache_key``), unless the client names one."""

    def kept(self, session_id: str, behind: list[str]) -> None:
        """The session the request is kept in, once it is (and those it read beside its own): before the answer is written."""


class BodyCodec:
    """What every codec keeps of the client's body: the model it names, and the fields it sends on (``base``)."""

    body: dict[str, Any]
    base: dict[str, Any]

    @property
    def model(self) -> str:
        """The model the client asked for ("" where it named none)."""
        return str(self.body.get("model") or "")

    def cache_key(self, key: str) -> None:
        """Route the request's calls by ``key`` (OpenAI's ``prompt_cache_key``), unless the client names one."""
        self.base.setdefault("prompt_cache_key", key)

    def kept(self, session_id: str, behind: list[str]) -> None:
        """An answer that tells nothing of its session (but a compaction's, ``context_management``)."""


class ToolsCodec(BodyCodec):
    """What the Responses and Messages codecs share: the client's tools sent as it wrote them, the
    directives' after them in the tools channel, and every field the proxy does not set as the client
    sent it. A subclass says how a call's chat messages are written (``prompt``) and how a tool is
    read (``chat_tool``) and written (``directive_tool``) in its API."""

    own_fields: tuple[str, ...] = ()  # fields the proxy sets itself on worker calls
    choices = 1
    components = None  # inline PACT components are chat's (``pcp_components``)

    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.streamed = bool(body.get("stream"))
        self.tools: list[dict[str, Any]] = list(body.get("tools") or [])
        self.client_tools = [self.chat_tool(tool) for tool in self.tools]
        self.base = {k: v for k, v in body.items() if k not in self.own_fields}

    def worker_body(self, call: CallWorker, stream: bool) -> bytes:
        """A worker call in the API's shape: the client's fields, the call's prompt, its tools after the client's."""
        body = {**self.base, **self.prompt(call.messages, call.cuts, call.marks)}
        tools = [*self.tools, *directive_tools(call, self.client_tools, self.directive_tool)]
        if tools:
            body["tools"] = tools
            if self.tools and "tool_choice" in self.body:
                body["tool_choice"] = self.body["tool_choice"]
        if stream:
            body["stream"] = True
        return _ENCODER.encode(body)  # fields the proxy does not read are msgspec.Raw: sent as the client wrote them

    def prompt(self, messages: list[dict[str, Any]], cuts: Sequence[int] = (), marks: Sequence[int] = ()) -> dict[str, Any]:
        """A call's chat messages in the API's shape (``cuts``: where its system text may divide, ``marks``: where
        a cache entry is worth its mark, ``CallWorker.cuts`` and ``marks``)."""
        raise NotImplementedError

    @staticmethod
    def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
        """A client's tool as the rounds read it (chat's shape)."""
        raise NotImplementedError

    @staticmethod
    def directive_tool(function: dict[str, Any]) -> dict[str, Any]:
        """A directive's function as a tool of the API."""
        raise NotImplementedError

    def events(self, final: dict[str, Any]) -> AsyncIterator[bytes]:
        """Refused: the API asks for one answer."""
        raise NotImplementedError("the API asks for one answer")  # ``choices`` is 1


_ENCODER = msgspec.json.Encoder()


def whole_body(body: bytes, read: frozenset[str], decoded: dict[str, Any]) -> dict[str, Any]:
    """Every field of the request: those ``decoded`` already, those in ``read`` decoded now, the
    rest as the bytes the client sent (``msgspec.Raw``), so what the proxy does not read (a number
    past a double's range, text that is not UTF-8) is the upstream's to judge, as in passthrough."""
    fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    return {
        key: decoded[key] if key in decoded else decode_json(bytes(raw), msgspec.json.decode, field=key) if key in read else raw for key, raw in fields.items()
    }


class _Tools(msgspec.Struct):
    tools: msgspec.Raw = msgspec.Raw(b"null")  # msgspec takes Raw in no union


_TOOLS = msgspec.json.Decoder(_Tools)


def tools_text(body: bytes) -> str:
    """The request's tool definitions as the client wrote them (``tools``, JSON), "" when it has none: part of
    the prompt the upstream reads, so the Sentry counts them (a coding agent's are ~16k tokens of a ~19k prompt)."""
    raw = bytes(decode_json(body, _TOOLS.decode).tools)
    return "" if raw == b"null" else decode_json(raw, bytes.decode, field="tools")


def checked(text: str | bytes, shape: type, what: str, code: str) -> dict[str, Any]:
    """``text`` decoded, once it is known to have ``shape``; else the 502 that says where it differs."""
    try:
        data = msgspec.json.decode(text)  # strict JSON: no NaN, no number past a double's range
        msgspec.convert(data, shape)
    except (ValueError, RecursionError, msgspec.MsgspecError) as exc:
        raise UpstreamError(f"the upstream's answer is not {what} ({exc}): {text[:200]!r}", code=code) from None
    return data


def split_system(messages: Iterable[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """A call's messages as its system text (a worker call's: the client's head) and the others."""
    system: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for message in messages:
        (system if message.get("role") == "system" else rest).append(message)
    return "\n\n".join(message_text(m) for m in system), rest


def directive_tools(call: CallWorker, client_tools: list[Any], shape: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    """The directives' tools a worker call carries after the client's (the tools channel), in the API's ``shape``."""
    return [shape(tool["function"]) for tool in call.tools[len(client_tools) :]]


def count_of(counts: Any, name: str) -> int:
    """``counts[name]`` when it is a count; 0 for anything else (an upstream's usage is read, never trusted)."""
    value = counts.get(name) if isinstance(counts, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A tool call as the rounds read it (chat's shape)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def text_of(value: Any) -> str:
    """A field that should hold text, as text: JSON for anything else, nothing for null."""
    return value if isinstance(value, str) else "" if value is None else json.dumps(value)
