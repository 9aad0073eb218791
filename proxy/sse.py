"""Server-sent events: where an event ends, what makes a stream whole, how a failure is told in one.

A failure after the first byte of a stream can no longer be a status: it is
told as OpenAI-compatible servers tell it, an event ``data: {"error": {…}}``
with no ``[DONE]`` after it (the openai SDK raises ``APIError`` on it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import msgspec

from .errors import PcpError, UpstreamError

__all__ = ["ChatRules", "StreamReader", "StreamRules", "error_event", "event_end", "is_event_stream", "said"]

DONE = b"[DONE]"


def error_event(error: PcpError) -> bytes:
    return b"data: " + error.envelope() + b"\n\n"


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


class ChatRules:
    """A streamed chat completion is whole when it carried at least one choice and
    ended with ``[DONE]`` or a ``finish_reason``."""

    def __init__(self, check: Callable[[bytes], dict[str, Any]]):
        self.check = check
        self.choices = False  # an event carried a choice
        self.finished = False  # a choice carried its finish_reason
        self.done = False  # [DONE] came

    def failure(self, chunk: dict[str, Any]) -> str | None:
        if "error" in chunk and not chunk.get("choices"):
            return said(chunk["error"])
        for choice in chunk.get("choices") or ():
            self.choices = True
            self.finished = self.finished or bool(isinstance(choice, dict) and choice.get("finish_reason"))
        return None

    def missing(self) -> str | None:
        if self.choices and (self.done or self.finished):
            return None
        return "no finish_reason and no [DONE] (cut short?)" if self.choices else "no event carried a choice"


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
