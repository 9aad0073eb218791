"""Chat completions' answer read back as the translated API's: an error's envelope, a whole answer, or a stream as it arrives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from ...decoding import strict_json
from ...errors import UpstreamError
from ...sse import DONE, DataLines
from ..chat.chunks import collect_tool_calls, first_deltas
from ..codec import text_of
from ..stops import Stops

__all__ = ["CHAT_PATH", "Translator", "chat_headers", "translated"]

CHAT_PATH = "/chat/completions"
# What speaks to the API the client called, not to a chat upstream; x-api-key becomes its Bearer key.
_DROPPED = frozenset({"anthropic-version", "anthropic-beta", "x-api-key", "openai-beta", "content-length", "content-type"})
# What of the chat answer's headers no longer describes the translated one.
_REWRITTEN = frozenset({"content-length", "content-type", "content-encoding", "transfer-encoding", "etag"})


@dataclass(frozen=True)
class Translator:
    """One API over chat completions: its request as chat's, chat's answer, stream and error as its own."""

    name: str
    chat_body: Callable[[dict[str, Any]], dict[str, Any]]  # the request as a chat completion's body
    answer: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]  # a whole chat completion as the API's answer to the request
    error_body: Callable[[int, bytes], bytes]  # an upstream's error status and body in the API's envelope
    events: Callable[[dict[str, Any]], Any]  # a chat stream written as the API's events, as it comes
    stops: Callable[[dict[str, Any]], list[str]] = lambda asked: []


def chat_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The call's headers for a chat upstream: Anthropic's key as the Bearer key (unless one is set), its version headers left out."""
    lowered = {k.lower(): v for k, v in headers.items()}
    out = {k: v for k, v in lowered.items() if k not in _DROPPED}
    if "authorization" not in out and lowered.get("x-api-key"):
        out["authorization"] = f"Bearer {lowered['x-api-key']}"
    out["content-type"] = "application/json"
    return out


async def translated(translator: Translator, asked: dict[str, Any], chat: httpx.Response, request: httpx.Request, streamed: bool = False) -> httpx.Response:
    """Chat's answer as the API's: an error's envelope, a whole answer, or a stream translated as it arrives.

    ``streamed``: the chat completion was asked as a stream, which a whole answer is then read from
    (where the proxy watches for stop sequences itself)."""
    headers = {k: v for k, v in chat.headers.items() if k.lower() not in _REWRITTEN}
    if chat.status_code >= 400 or not asked.get("stream"):
        if chat.status_code < 400 and streamed and chat.headers.get("content-type", "").startswith("text/event-stream"):
            content = json.dumps(translator.answer(await _collected(chat, Stops(translator.stops(asked))), asked)).encode()
            headers["content-type"] = "application/json"
            return httpx.Response(chat.status_code, headers=headers, stream=httpx.ByteStream(content), request=request, extensions=chat.extensions)
        try:
            body = await chat.aread()
        finally:
            await chat.aclose()
        if chat.status_code >= 400:
            content = translator.error_body(chat.status_code, body)
        else:
            content = json.dumps(translator.answer(_completion(body), asked)).encode()
        headers["content-type"] = "application/json"
        return httpx.Response(chat.status_code, headers=headers, stream=httpx.ByteStream(content), request=request, extensions=chat.extensions)
    if not chat.headers.get("content-type", "").startswith("text/event-stream"):
        body = await chat.aread()
        await chat.aclose()
        raise UpstreamError(
            f"the upstream answered a streamed chat completion with {chat.headers.get('content-type')}: {body[:200]!r}", code="upstream_bad_stream"
        )
    headers["content-type"] = "text/event-stream"
    return httpx.Response(chat.status_code, headers=headers, stream=_Events(translator.events(asked), chat), request=request, extensions=chat.extensions)


async def _collected(chat: httpx.Response, stops: Stops) -> dict[str, Any]:
    """A chat stream read whole as the chat completion it tells, cut at the first of ``stops`` to complete (then
    the stream is closed, the sequence named in the choice's ``stop_sequence`` and the text chunks read in ``pieces``)."""
    completion: dict[str, Any] = {"id": "", "object": "chat.completion", "model": "", "choices": [], "usage": None, "pieces": 0}
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: Any = None
    lines = DataLines()
    try:
        async for raw in chat.aiter_raw():
            for data in lines.feed(raw):
                if data == DONE:
                    continue
                try:
                    chunk = strict_json(data)
                except (ValueError, RecursionError):
                    raise UpstreamError(
                        f"the upstream's stream holds an event that is not JSON (or holds a number past a double's range): {data[:200]!r}",
                        code="upstream_bad_stream",
                    ) from None
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk and not chunk.get("choices"):
                    raise UpstreamError(f"the upstream sent an error in its stream: {str(chunk['error'])[:300]}", code="upstream_error")
                completion.update({k: chunk[k] for k in ("id", "model", "created") if chunk.get(k)})
                completion["usage"] = chunk.get("usage") or completion["usage"]
                for delta, finished in first_deltas(chunk):
                    if delta.get("content"):
                        completion["pieces"] += 1
                        text.append(stops.feed(text_of(delta["content"])))
                    collect_tool_calls(calls, delta.get("tool_calls") or ())
                    finish = finished or finish
                if stops.fired is not None:
                    break
            if stops.fired is not None:
                break
    finally:
        await chat.aclose()
    if stops.fired is not None:
        finish, calls = "stop", {}
    elif finish is None:
        raise UpstreamError("the upstream's stream ended before its answer did (no finish_reason)", code="upstream_bad_stream")
    text.append(stops.flush())
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    completion["choices"] = [{"index": 0, "message": message, "finish_reason": finish, "stop_sequence": stops.fired}]
    return completion


def _completion(body: bytes) -> dict[str, Any]:
    """A whole chat completion decoded, or the 502 that says it is not one."""
    try:
        completion = strict_json(body)  # a number past a double's range is not read as Infinity, to be written back so
    except (ValueError, RecursionError):
        completion = None
    if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list) or not completion["choices"]:
        raise UpstreamError(
            f"the upstream's answer is not a chat completion (or holds a number past a double's range): {body[:200]!r}", code="upstream_bad_response"
        )
    return completion


class _Events(httpx.AsyncByteStream):
    """A chat stream's chunks as the API's events, as they arrive; closing it closes the chat stream.

    A stream that ends with an error event, or stops before it is whole (no ``[DONE]``, no finish
    reason), ends with the API's error event and never with the events that complete an answer.
    """

    def __init__(self, events: Any, chat: httpx.Response):
        self.events = events  # the API's ``ChatEvents``
        self.chat = chat
        self.whole = False  # [DONE] came
        self.failed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The API's events, as the chat stream's chunks arrive."""
        lines = DataLines()
        async for raw in self.chat.aiter_raw():
            out = []
            for data in lines.feed(raw):
                if self.failed or self.whole:
                    break
                out.append(self._data(data))
                self.whole = self.whole or bool(getattr(self.events, "ended", False))  # a stop sequence fired: the rest is not the client's
            if out:
                yield b"".join(out)
            if self.failed or self.whole:
                break
        else:
            last = lines.rest()
            if last is not None and not (self.failed or self.whole):
                yield self._data(last)
        if getattr(self.events, "ended", False):
            await self.chat.aclose()  # ends the generation
        if self.failed:
            return
        if not (self.whole or self.events.finish_reason is not None):
            yield self.events.failure("the upstream's stream ended before its answer did (no finish_reason, no [DONE])", "upstream_bad_stream")
            return
        yield self.events.closing()

    def _data(self, data: bytes) -> bytes:
        """The API's events for one ``data:`` line of the chat stream."""
        if data == DONE:
            self.whole = True
            return b""
        try:
            chunk = strict_json(data)
        except (ValueError, RecursionError):
            self.failed = True
            return self.events.failure(
                f"the upstream's stream holds an event that is not JSON (or holds a number past a double's range): {data[:200]!r}", "upstream_bad_stream"
            )
        if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
            error = chunk["error"]
            self.failed = True
            return self.events.failure(f"the upstream sent an error in its stream: {str(error.get('message') if isinstance(error, dict) else error)[:300]}")
        return self.events.read(chunk) if isinstance(chunk, dict) else b""

    async def aclose(self) -> None:
        """Close the chat stream (which ends the generation)."""
        await self.chat.aclose()
