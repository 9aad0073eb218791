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

__all__ = [
    "DONE",
    "DataLines",
    "StreamReader",
    "StreamRules",
    "data_event",
    "data_field",
    "error_message",
    "event_end",
    "is_event_stream",
    "named_event",
    "typed_event",
]

DONE = b"[DONE]"  # the data of the event that ends a chat completion's stream


def data_event(data: bytes) -> bytes:
    """One server-sent event of ``data`` alone, as chat completions write them."""
    return b"data: " + data + b"\n\n"


def named_event(kind: str, payload: dict[str, Any]) -> bytes:
    """One server-sent event as the Responses and Messages APIs write them: its type named twice."""
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()


def typed_event(kind: str, **fields: Any) -> bytes:
    """One event of the Responses or Messages API: ``kind`` named, and first among its fields as ``type``."""
    return named_event(kind, {"type": kind, **fields})


def is_event_stream(content_type: str | None) -> bool:
    """Whether a ``content-type`` is that of an event stream."""
    return (content_type or "").lstrip().lower().startswith("text/event-stream")


def event_end(buffer: bytes) -> int:
    """Where the last whole event of ``buffer`` ends (0: none has): after a blank line, LF or CRLF."""
    lf, crlf = buffer.rfind(b"\n\n"), buffer.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def data_field(line: bytes) -> bytes | None:
    """What one line of a stream carries as ``data:``, stripped; None for any other line (an ``event:`` line names it again)."""
    line = line.rstrip(b"\r")
    return line[5:].strip() if line.startswith(b"data:") else None


class DataLines:
    """The ``data:`` fields of an event stream, line by line, from its raw bytes as they come."""

    def __init__(self) -> None:
        self.pending = b""  # the start of a line whose end has not come yet

    def feed(self, raw: bytes) -> list[bytes]:
        """The data of each line that ``raw`` completes, in order."""
        lines = (self.pending + raw).split(b"\n")
        self.pending = lines.pop()
        return [data for data in map(data_field, lines) if data is not None]

    def rest(self) -> bytes | None:
        """The data of a last line with no line break after it, once the stream has ended."""
        return data_field(self.pending)


class StreamRules(Protocol):
    """What makes one API's stream whole, and how it tells a failure."""

    done: bool  # the stream has marked its own end: nothing after this is read

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
        """Each JSON event of the stream, checked; a 502 where it fails or ends short of whole."""
        rules, lines = self.rules, DataLines()
        async for piece in raw:
            for data in lines.feed(piece):
                chunk = self._event(data)
                if chunk is not None:
                    yield chunk
                if rules.done:
                    break
            if rules.done:
                break
        else:
            last = lines.rest()  # a last line with no line break
            chunk = None if last is None else self._event(last)
            if chunk is not None:
                yield chunk
        missing = rules.missing()
        if missing is not None:
            raise UpstreamError(f"the upstream at {self.upstream} ended its stream before its answer: {missing}", code="upstream_bad_stream")

    def _event(self, data: bytes) -> dict[str, Any] | None:
        """One event's data decoded and checked (None: ``[DONE]``); an error event raises."""
        if data == DONE:
            self.rules.done = True
            return None
        chunk = self.rules.check(data)
        failed = self.rules.failure(chunk)
        if failed is not None:
            raise UpstreamError(f"the upstream at {self.upstream} sent an error in its stream: {failed}", code="upstream_error_event")
        return chunk


def error_message(error: Any) -> str:
    """An error object's message, for the 502 that passes it on."""
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:300] if message is not None else msgspec.json.encode(error).decode()[:300]
