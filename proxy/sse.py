"""Server-sent events: where an event ends, what makes a stream whole, how a failure is told in one.

A failure after the first byte of a stream can no longer be a status: it is
told as OpenAI-compatible servers tell it, an event ``data: {"error": {…}}``
with no ``[DONE]`` after it (the openai SDK raises ``APIError`` on it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

import msgspec

from .errors import UpstreamError

__all__ = ["DONE", "StreamReader", "StreamRules", "data_event", "event_end", "is_event_stream", "named_event", "said"]

DONE = b"[DONE]"  # the data of the event that ends a chat completion's stream


def data_event(data: bytes) -> bytes:
    """One server-sent event of ``data`` alone, as chat completions write them."""
    return b"data: " + data + b"\n\n"


def named_event(kind: str, payload: dict[str, Any]) -> bytes:
    """One server-sent event as the Responses and Messages APIs write them: its type named twice."""
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()


def is_event_stream(content_type: str | None) -> bool:
    return (content_type or "").lstrip().lower().startswith("text/event-stream")


def event_end(buffer: bytes) -> int:
    """Where the last whole event of ``buffer`` ends (0: none has): after a blank line, LF or CRLF."""
    lf, crlf = buffer.rfind(b"\n\n"), buffer.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


class StreamRules(Protocol):
    """What makes one API's stream whole, and how it tells a failure."""

    done: bool  # the stream said it is over: nothing after this is read

    def check(self, data: bytes) -> dict[str, Any]:
        """One event's data decoded, or the 502 that says where it differs from what the proxy reads."""

    def failure(self, event: dict[str, Any]) -> str | None:
        """What the upstream says went wrong, if ``event`` is an error; else None, and the event is taken in."""

    def missing(self) -> str | None:
        """What the stream lacks to be whole, once it has ended (None: nothing)."""

    def whole(self, body: bytes) -> list[dict[str, Any]]:
        """An answer that came whole (a server that ignores ``stream``), as the events of its stream; or the 502 that says it is not one."""


class StreamReader:
    """The JSON events of a stream, from its raw bytes, checked as they come by the API's ``rules``.

    A stream that ends before it is whole (cut, empty) or carries an error
    event fails with a 502 that says so, as an answer of the wrong shape does
    unstreamed.
    """

    def __init__(self, rules: StreamRules, upstream: str):
        self.rules = rules
        self.upstream = upstream

    async def chunks(self, raw: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
        rules, pending = self.rules, b""
        async for data in raw:
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                chunk = self._event(line.rstrip(b"\r"))
                if chunk is not None:
                    yield chunk
                if rules.done:
                    break
            if rules.done:
                break
        else:
            chunk = self._event(pending.rstrip(b"\r"))  # a last line with no line break
            if chunk is not None:
                yield chunk
        missing = rules.missing()
        if missing is not None:
            raise UpstreamError(f"the upstream at {self.upstream} ended its stream before its answer: {missing}", code="upstream_bad_stream")

    def _event(self, line: bytes) -> dict[str, Any] | None:
        if not line.startswith(b"data:"):  # an ``event:`` line names what its data says again
            return None
        data = line[5:].strip()
        if data == DONE:
            self.rules.done = True
            return None
        chunk = self.rules.check(data)
        failed = self.rules.failure(chunk)
        if failed is not None:
            raise UpstreamError(f"the upstream at {self.upstream} sent an error in its stream: {failed}", code="upstream_error_event")
        return chunk


def said(error: Any) -> str:
    """An error object's message, for the 502 that passes it on."""
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:300] if message is not None else msgspec.json.encode(error).decode()[:300]
