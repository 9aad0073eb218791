"""Server-sent events of the chat API: where an event ends, what makes a stream whole, how a failure is told in one.

A failure after the first byte of a stream can no longer be a status: it is
told as OpenAI-compatible servers tell it, an event ``data: {"error": {…}}``
with no ``[DONE]`` after it (the openai SDK raises ``APIError`` on it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from .errors import PcpError, UpstreamError

__all__ = ["ChatStreamReader", "error_event", "event_end", "is_event_stream"]

DONE = b"[DONE]"


def error_event(error: PcpError) -> bytes:
    return b"data: " + error.envelope() + b"\n\n"


def is_event_stream(content_type: str | None) -> bool:
    return (content_type or "").lstrip().lower().startswith("text/event-stream")


def event_end(buffer: bytes) -> int:
    """Where the last whole event of ``buffer`` ends (0: none has): after a blank line, LF or CRLF."""
    lf, crlf = buffer.rfind(b"\n\n"), buffer.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


class ChatStreamReader:
    """The JSON chunks of a streamed chat completion, from its raw bytes, checked as they come.

    A stream is whole when it carried at least one choice and ended with
    ``[DONE]`` or a ``finish_reason``; one that ends otherwise (cut, empty,
    only ``{"choices": []}``) or carries an error event fails with a 502
    that says so, as an answer that is not a completion does unstreamed.
    """

    def __init__(self, check: Callable[[bytes], dict[str, Any]], upstream: str):
        self.check = check  # decodes one event's data, or raises the 502 that says where it differs
        self.upstream = upstream
        self.choices = False  # an event carried a choice
        self.finished = False  # a choice carried its finish_reason
        self.done = False  # [DONE] came

    async def chunks(self, raw: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
        pending = b""
        async for data in raw:
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                chunk = self._event(line.rstrip(b"\r"))
                if chunk is not None:
                    yield chunk
                if self.done:
                    break
            if self.done:
                break
        else:
            chunk = self._event(pending.rstrip(b"\r"))  # a last line with no line break
            if chunk is not None:
                yield chunk
        if not (self.choices and (self.done or self.finished)):
            raise UpstreamError(f"the upstream at {self.upstream} ended its stream before its answer: {self._missing()}", code="upstream_bad_stream")

    def _event(self, line: bytes) -> dict[str, Any] | None:
        if not line.startswith(b"data:"):
            return None
        data = line[5:].strip()
        if data == DONE:
            self.done = True
            return None
        chunk = self.check(data)
        if "error" in chunk and not chunk.get("choices"):
            raise UpstreamError(f"the upstream at {self.upstream} sent an error in its stream: {_said(chunk['error'])}", code="upstream_error_event")
        for choice in chunk.get("choices") or ():
            self.choices = True
            self.finished = self.finished or bool(isinstance(choice, dict) and choice.get("finish_reason"))
        return chunk

    def _missing(self) -> str:
        return "no finish_reason and no [DONE] (cut short?)" if self.choices else "no event carried a choice"


def _said(error: Any) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return str(message)[:300] if message is not None else msgspec.json.encode(error).decode()[:300]
