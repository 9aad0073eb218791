"""What a scripted upstream answers: a ``Reply`` to a ``Recorded`` request, and the chat-completions shapes of one."""

from __future__ import annotations

import functools
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..headers import ROLE

__all__ = ["Recorded", "Reply", "by_role", "completion", "embeddings", "embeddings_reply", "sse_chunks", "stream_reply"]

_ids = itertools.count(1)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""

    @property
    def json(self) -> Any:
        """The recorded body decoded."""
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    # Streaming: each item is sent as one body event; a float is a pause in seconds,
    # a threading.Event is waited on (at most 10 s) before going on.
    chunks: list[bytes | float | threading.Event] | None = None
    delay: float = 0.0


def completion(
    text: str = "ok",
    *,
    model: str = "fake-model",
    prompt_tokens: int = 10,
    completion_tokens: int = 2,
    tool_calls: list[dict[str, Any]] | None = None,
    n: int = 1,
    finish: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """A whole chat completion reply."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    body = {
        "id": f"chatcmpl-fake{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": i, "message": message, "finish_reason": finish or ("tool_calls" if tool_calls else "stop")} for i in range(n)],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }
    return Reply(body=json.dumps(body).encode(), headers={"content-type": "application/json", **(headers or {})})


@functools.lru_cache(maxsize=32)  # made once: a benchmark measures the proxy, not the fake's JSON encoder
def embeddings(count: int = 1, *, dimensions: int = 8, model: str = "fake-embedding") -> Reply:
    """An embeddings answer: ``count`` vectors of ``dimensions`` numbers."""
    data = [{"object": "embedding", "index": i, "embedding": [round(0.1 * (i + 1) * (d + 1), 3) for d in range(dimensions)]} for i in range(count)]
    return Reply(body=json.dumps({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": count, "total_tokens": count}}).encode())


def sse_chunks(
    pieces: Iterable[str],
    *,
    model: str = "fake-model",
    usage: dict[str, int] | None = None,
    finish: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> list[bytes]:
    """The SSE events of a streamed completion that says ``pieces`` in order and makes ``tool_calls`` (their
    arguments in two deltas), ending for ``finish``; ``usage`` comes in an event of its own, as OpenAI sends it
    when asked (``stream_options.include_usage``)."""
    cid = f"chatcmpl-fake{next(_ids)}"

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        """One chunk of the stream as an event."""
        chunk = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": piece}) for piece in pieces]
    for i, call in enumerate(tool_calls or ()):
        arguments = call["function"]["arguments"]
        opened = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": arguments[: len(arguments) // 2]},
        }
        events += [event({"tool_calls": [opened]}), event({"tool_calls": [{"index": i, "function": {"arguments": arguments[len(arguments) // 2 :]}}]})]
    events.append(event({}, finish or ("tool_calls" if tool_calls else "stop")))
    if usage:
        chunk = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model, "choices": [], "usage": usage}
        events.append(f"data: {json.dumps(chunk)}\n\n".encode())
    events.append(b"data: [DONE]\n\n")
    return events


def stream_reply(pieces: Iterable[str], *, headers: dict[str, str] | None = None, **kwargs: Any) -> Reply:
    """A streamed chat completion reply of ``pieces``."""
    return Reply(headers={"content-type": "text/event-stream", **(headers or {})}, chunks=list(sse_chunks(pieces, **kwargs)))


def embeddings_reply(vector: Callable[[str], Any]) -> Callable[[Recorded], Reply]:
    """An ``/embeddings`` answer giving each input text ``vector(text)`` (a ``StandInEmbedder``'s, say)."""

    def answer(recorded: Recorded) -> Reply:
        """The embeddings reply for the recorded texts."""
        texts = recorded.json["input"]
        data = [
            {"object": "embedding", "index": i, "embedding": [float(x) for x in vector(text)]}
            for i, text in enumerate([texts] if isinstance(texts, str) else texts)
        ]
        return Reply(body=json.dumps({"object": "list", "data": data, "model": recorded.json["model"]}).encode())

    return answer


def by_role(replies: dict[str, Reply], default: Reply) -> Callable[[Recorded], Reply]:
    """A script that answers each ``x-pcp-role`` (worker, router, consolidator) with its own reply."""
    return lambda recorded: replies.get(recorded.headers.get(ROLE, ""), default)
