"""Every API on any chat-completions upstream: Responses and Messages calls sent as chat completions where the upstream lacks them.

``Upstream.open`` asks ``Translation.of`` whether a call may need it: a POST of
``/responses`` or ``/messages``. Then, by the ``translate_apis`` setting:

* ``auto``: the call goes as it came; an answer of 404 or 405 means the upstream
  lacks the path, and the call is sent again as a chat completion. If chat
  completions answer (anything but a 404 or 405 again: a wrong model name is a
  404 on both), the upstream is remembered to lack the path and every later
  call of it goes translated at once. Where the upstream speaks the API itself,
  nothing changes: its answer goes back byte for byte.
* ``always``: every such call goes as a chat completion (the embedded model).
* ``never``: none does.

The translated answer is an ``httpx.Response`` like any other, so passthrough
and protocol mode read it as they read the API's own: whole, or as a stream
translated as it arrives (closing it closes the upstream's, which stops the
generation). The translations themselves are ``responses_chat`` and ``messages_chat``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from ..decoding import strict_json
from ..errors import ClientError, UpstreamError
from ..sse import DONE
from . import messages_chat, responses_chat
from .codec import collect_tool_calls, first_deltas, text_of
from .stops import Stops

__all__ = ["Translation", "Translator"]

log = logging.getLogger("pcp.upstream")

Send = Callable[[str, bytes, Mapping[str, str]], Awaitable[httpx.Response]]
CHAT_PATH = "/chat/completions"
LACKING = (404, 405)
# What speaks to the API the client called, not to a chat upstream; x-api-key becomes its Bearer key.
_DROPPED = frozenset({"anthropic-version", "anthropic-beta", "x-api-key", "openai-beta", "content-length", "content-type"})
# What of the chat answer's headers no longer describes the translated one.
_REWRITTEN = frozenset({"content-length", "content-type", "content-encoding", "transfer-encoding", "etag"})


@dataclass(frozen=True)
class Translator:
    """One API over chat completions: its request as chat's, chat's answer, stream and error as its own."""

    name: str
    request: Callable[[dict[str, Any]], dict[str, Any]]
    reply: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    failure: Callable[[int, bytes], bytes]
    round: Callable[[dict[str, Any]], Any]
    stops: Callable[[dict[str, Any]], list[str]] = lambda asked: []


TRANSLATORS = {
    "/responses": Translator("responses", responses_chat.request, responses_chat.reply, responses_chat.failure, responses_chat.Round),
    "/messages": Translator("messages", messages_chat.request, messages_chat.reply, messages_chat.failure, messages_chat.Round, messages_chat.stop_sequences),
}


class Translation:
    """Which calls of one upstream go as chat completions, and what it has been found to lack."""

    def __init__(self, mode: Literal["auto", "always", "never"] = "auto"):
        self.mode = mode
        self.lacking: set[str] = set()  # paths this upstream answered 404 or 405 where chat completions answered
        self.reasons: dict[str, str] = {}  # why a path of ``lacking`` is translated
        self.native: set[str] = set()  # paths this upstream answered in the API's own shape

    def fronts(self) -> dict[str, str]:
        """How each API reaches this upstream, as ``/healthz`` says it: ``native``, ``translated (why)``, or not yet known."""
        said = {}
        for path, translator in TRANSLATORS.items():
            if self.mode != "auto":
                said[translator.name] = {"always": "translated (PCP_TRANSLATE_APIS=always)", "never": "native (PCP_TRANSLATE_APIS=never)"}[self.mode]
            elif path in self.lacking:
                said[translator.name] = f"translated ({self.reasons.get(path, 'the upstream lacks it')})"
            else:
                said[translator.name] = "native" if path in self.native else "native unless its first answer shows it partial or missing"
        return said

    def _translate_from_now(self, translator: Translator, path: str, reason: str) -> None:
        self.lacking.add(path)
        self.reasons[path] = reason
        log.info("the upstream's %s calls are sent as chat completions from now on: %s", translator.name, reason)

    def of(self, method: str, path: str) -> Translator | None:
        """The translator a call may need (None: it goes as it came, whatever the upstream answers)."""
        if self.mode == "never" or method != "POST":
            return None
        return TRANSLATORS.get(path)

    async def open(self, translator: Translator, path: str, content: bytes | None, headers: Mapping[str, str], send: Send) -> httpx.Response:
        """The call's answer: the upstream's own, or (where it lacks ``path``) chat completions' translated."""
        native = None
        if self.mode == "auto" and path not in self.lacking:
            native = await send(path, content or b"", headers)
            partial = _partial_front(path, native)
            if partial is None and native.status_code not in LACKING:
                checked, fault = await _checked(translator, native)
                if fault is None:
                    self.native.add(path)
                    return checked
                partial = f"its {path} answered what is not the {translator.name} API ({fault})"
            if partial is not None:  # its answer is not used: the call goes as a chat completion, now and later
                await native.aclose()
                native = None
                self._translate_from_now(translator, path, partial)
            else:
                await native.aread()  # a short error: kept, in case chat completions are missing too
                await native.aclose()
        asked = _decoded(content)
        body = translator.request(asked)
        chat = await send(CHAT_PATH, json.dumps(body).encode(), chat_headers(headers))
        if native is not None:
            if chat.status_code in LACKING:  # neither: the upstream's first answer stands
                await chat.aclose()
                return httpx.Response(
                    native.status_code, headers=native.headers, stream=httpx.ByteStream(native.content), request=native.request, extensions=native.extensions
                )
            self._translate_from_now(translator, path, f"it answered POST {path} with {native.status_code}")
        return await translated(translator, asked, chat, streamed=bool(body.get("stream")))


# Servers whose own endpoints of these APIs are partial, by their ``Server`` header: llama.cpp's
# /v1/responses streams events without sequence_number or output_index and refuses an earlier
# assistant message in its input; its /v1/messages answers errors in OpenAI's envelope.
KNOWN_PARTIAL = {"llama.cpp": ("/responses", "/messages")}


def _partial_front(path: str, native: httpx.Response) -> str | None:
    """Why the upstream's own ``path`` is not used, when its server is one known to speak it in part."""
    server = native.headers.get("server", "").lower()
    for name, paths in KNOWN_PARTIAL.items():
        if server.startswith(name) and path in paths:
            return f"the upstream is {name}, whose {path} is partial"
    return None


async def _checked(translator: Translator, native: httpx.Response) -> tuple[httpx.Response, str | None]:
    """The upstream's own answer, and what shows it does not speak the API (None: nothing does).

    A stream's first event must be one of the API's: a typed event, numbered by its
    ``sequence_number`` in Responses; what was read of it is handed on with the rest.
    An error is the upstream's to give, and a whole answer of another shape a 502 that says so,
    as from any upstream. A Responses answer that shows Ollama's own (``_ollama``) is not used."""
    if native.status_code >= 300:
        return native, None
    kind = native.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        read, chunks = b"", native.aiter_raw()
        async for chunk in chunks:
            read += chunk
            if b"\n\n" in read.replace(b"\r\n", b"\n"):
                break
        fault = _first_event_fault(translator.name, read)
        return _replayed(native, read, chunks), fault
    if translator.name != "responses" or not kind.startswith("application/json"):
        return native, None
    body = await native.aread()
    try:
        said = json.loads(body)
    except ValueError:
        said = None
    replayed = httpx.Response(native.status_code, headers=native.headers, stream=httpx.ByteStream(body), request=native.request, extensions=native.extensions)
    return replayed, _ollama(said)


# Ollama names its responses "resp_" and a number under a million (OpenAI's: 48 hex digits), with a
# service_tier "default"; its own /v1/responses answers every tool_choice as "auto", and keeps no store
# nor metadata.
_OLLAMA_ID = re.compile(r"resp_\d{1,6}")


def _ollama(response: Any) -> str | None:
    said = response.get("id") if isinstance(response, dict) else None
    if isinstance(said, str) and _OLLAMA_ID.fullmatch(said) and response.get("service_tier") == "default":
        return "the upstream is Ollama (by its response ids), whose /responses is partial"
    return None


def _first_event_fault(name: str, read: bytes) -> str | None:
    event = None
    for line in read.replace(b"\r\n", b"\n").split(b"\n\n")[0].split(b"\n"):
        said = _data(line)
        if said is not None:
            try:
                event = json.loads(said)
            except ValueError:
                event = None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return "its stream's first event has no type"
    if name == "responses" and not isinstance(event.get("sequence_number"), int):
        return "its events have no sequence_number"
    return _ollama(event.get("response")) if name == "responses" else None


def _replayed(native: httpx.Response, read: bytes, rest: AsyncIterator[bytes]) -> httpx.Response:
    return httpx.Response(
        native.status_code, headers=native.headers, stream=_Prefixed(read, rest, native), request=native.request, extensions=native.extensions
    )


class _Prefixed(httpx.AsyncByteStream):
    """What was read of a stream, then the rest of it; closing it closes the upstream's."""

    def __init__(self, read: bytes, rest: AsyncIterator[bytes], native: httpx.Response):
        self.read, self.rest, self.native = read, rest, native

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.read:
            yield self.read
        async for chunk in self.rest:
            yield chunk

    async def aclose(self) -> None:
        await self.native.aclose()


def _decoded(content: bytes | None) -> dict[str, Any]:
    try:
        asked = strict_json(content or b"")
    except (ValueError, RecursionError) as exc:
        raise ClientError(f"the request body is not JSON: {exc}", code="invalid_json") from None
    if not isinstance(asked, dict):
        raise ClientError("the request body is not a JSON object", code="invalid_json")
    return asked


def chat_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The call's headers for a chat upstream: Anthropic's key as the Bearer key (unless one is set), its version headers left out."""
    said = {k.lower(): v for k, v in headers.items()}
    out = {k: v for k, v in said.items() if k not in _DROPPED}
    if "authorization" not in out and said.get("x-api-key"):
        out["authorization"] = f"Bearer {said['x-api-key']}"
    out["content-type"] = "application/json"
    return out


async def translated(translator: Translator, asked: dict[str, Any], chat: httpx.Response, streamed: bool = False) -> httpx.Response:
    """Chat's answer as the API's: an error's envelope, a whole answer, or a stream translated as it arrives.

    ``streamed``: the chat completion was asked as a stream, which a whole answer is then read from
    (where the proxy watches for stop sequences itself)."""
    headers = {k: v for k, v in chat.headers.items() if k.lower() not in _REWRITTEN}
    if chat.status_code >= 400 or not asked.get("stream"):
        if chat.status_code < 400 and streamed and chat.headers.get("content-type", "").startswith("text/event-stream"):
            content = json.dumps(translator.reply(await _collected(chat, Stops(translator.stops(asked))), asked)).encode()
            headers["content-type"] = "application/json"
            return httpx.Response(chat.status_code, headers=headers, stream=httpx.ByteStream(content), request=chat.request, extensions=chat.extensions)
        try:
            body = await chat.aread()
        finally:
            await chat.aclose()
        if chat.status_code >= 400:
            content = translator.failure(chat.status_code, body)
        else:
            content = json.dumps(translator.reply(_completion(body), asked)).encode()
        headers["content-type"] = "application/json"
        return httpx.Response(chat.status_code, headers=headers, stream=httpx.ByteStream(content), request=chat.request, extensions=chat.extensions)
    if not chat.headers.get("content-type", "").startswith("text/event-stream"):
        body = await chat.aread()
        await chat.aclose()
        raise UpstreamError(
            f"the upstream answered a streamed chat completion with {chat.headers.get('content-type')}: {body[:200]!r}", code="upstream_bad_stream"
        )
    headers["content-type"] = "text/event-stream"
    return httpx.Response(chat.status_code, headers=headers, stream=_Events(translator.round(asked), chat), request=chat.request, extensions=chat.extensions)


async def _collected(chat: httpx.Response, stops: Stops) -> dict[str, Any]:
    """A chat stream read whole as the chat completion it tells, cut at the first of ``stops`` to complete (then
    the stream is closed, the sequence named in the choice's ``stop_sequence`` and the text chunks read in ``pieces``)."""
    completion: dict[str, Any] = {"id": "", "object": "chat.completion", "model": "", "choices": [], "usage": None, "pieces": 0}
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: Any = None
    pending = b""
    try:
        async for data in chat.aiter_raw():
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                said = _data(line)
                if said is None or said == DONE:
                    continue
                try:
                    chunk = strict_json(said)
                except (ValueError, RecursionError):
                    raise UpstreamError(
                        f"the upstream's stream holds an event that is not JSON (or holds a number past a double's range): {said[:200]!r}",
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

    def __init__(self, round_: Any, chat: httpx.Response):
        self.round = round_
        self.chat = chat
        self.whole = False  # [DONE] came
        self.failed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        async for data in self.chat.aiter_raw():
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            out = []
            for line in lines:
                if self.failed or self.whole:
                    break
                out.append(self._line(line))
                self.whole = self.whole or bool(getattr(self.round, "ended", False))  # a stop sequence fired: the rest is not the client's
            if out:
                yield b"".join(out)
            if self.failed or self.whole:
                break
        else:
            if pending and not (self.failed or self.whole):
                yield self._line(pending)
        if getattr(self.round, "ended", False):
            await self.chat.aclose()  # ends the generation
        if self.failed:
            return
        if not (self.whole or self.round.finish_reason is not None):
            yield self.round.failure("the upstream's stream ended before its answer did (no finish_reason, no [DONE])", "upstream_bad_stream")
            return
        yield self.round.closing()

    def _line(self, line: bytes) -> bytes:
        said = _data(line)
        if said is None:
            return b""
        if said == DONE:
            self.whole = True
            return b""
        try:
            chunk = strict_json(said)
        except (ValueError, RecursionError):
            self.failed = True
            return self.round.failure(
                f"the upstream's stream holds an event that is not JSON (or holds a number past a double's range): {said[:200]!r}", "upstream_bad_stream"
            )
        if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
            error = chunk["error"]
            self.failed = True
            return self.round.failure(f"the upstream sent an error in its stream: {str(error.get('message') if isinstance(error, dict) else error)[:300]}")
        return self.round.read(chunk) if isinstance(chunk, dict) else b""

    async def aclose(self) -> None:
        await self.chat.aclose()


def _data(line: bytes) -> bytes | None:
    line = line.rstrip(b"\r")
    return line[5:].strip() if line.startswith(b"data:") else None
