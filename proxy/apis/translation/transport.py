"""Every API on any chat-completions upstream: Responses and Messages calls sent as chat completions where the upstream lacks them.

``Translation`` is an httpx transport in front of the one that reaches the
upstream: a POST of ``/responses`` or ``/messages`` below the upstream's base
URL may go as a chat completion, by the ``translate_apis`` setting:

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
generation). The translations themselves are each API's ``chat_request`` and
``chat_answer``; ``answers`` reads chat's answer back.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx

from ...decoding import strict_json
from ...errors import ClientError
from ...sse import data_field
from ...upstream import as_upstream_error, shown_url
from ..messages import chat_answer as messages_answer
from ..messages import chat_request as messages_request
from ..responses import chat_answer as responses_answer
from ..responses import chat_request as responses_request
from .answers import CHAT_PATH, Translator, chat_headers, translated

__all__ = ["Translation", "Translator"]

log = logging.getLogger("pcp.upstream")

LACKING = (404, 405)


TRANSLATORS = {
    "/responses": Translator("responses", responses_request.chat_body, responses_answer.response_of, responses_answer.error_body, responses_answer.ChatEvents),
    "/messages": Translator(
        "messages",
        messages_request.chat_body,
        messages_answer.message_of,
        messages_answer.error_body,
        messages_answer.ChatEvents,
        messages_request.stop_sequences,
    ),
}


class Translation(httpx.AsyncBaseTransport):
    """Which calls of one upstream go as chat completions, and what it has been found to lack; ``inner`` reaches it.

    ``base_url``: the upstream's, below which the APIs' paths are."""

    def __init__(self, inner: httpx.AsyncBaseTransport, base_url: str, mode: Literal["auto", "always", "never"] = "auto"):
        self.inner = inner
        self.mode = mode
        self.base_path = httpx.URL(base_url).path.rstrip("/")
        self.shown_url = shown_url(base_url)  # how the upstream is named in errors
        self.lacking: set[str] = set()  # paths this upstream answered 404 or 405 where chat completions answered
        self.reasons: dict[str, str] = {}  # why a path of ``lacking`` is translated
        self.native: set[str] = set()  # paths this upstream answered in the API's own shape

    def fronts(self) -> dict[str, str]:
        """How each API reaches this upstream, as ``/healthz`` says it: ``native``, ``translated (why)``, or not yet known."""
        fronts = {}
        for path, translator in TRANSLATORS.items():
            if self.mode != "auto":
                fronts[translator.name] = {"always": "translated (PCP_TRANSLATE_APIS=always)", "never": "native (PCP_TRANSLATE_APIS=never)"}[self.mode]
            elif path in self.lacking:
                fronts[translator.name] = f"translated ({self.reasons.get(path, 'the upstream lacks it')})"
            else:
                fronts[translator.name] = "native" if path in self.native else "native unless its first answer shows it partial or missing"
        return fronts

    def _translate_from_now(self, translator: Translator, path: str, reason: str) -> None:
        """Send every later call of ``path`` as a chat completion, for ``reason``."""
        self.lacking.add(path)
        self.reasons[path] = reason
        log.info("the upstream's %s calls are sent as chat completions from now on: %s", translator.name, reason)

    def path_of(self, request: httpx.Request) -> str | None:
        """The request's path below the upstream's base URL (None: it is not below it)."""
        path = request.url.path
        return path[len(self.base_path) :] if path.startswith(self.base_path) else None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The call's answer: as it came where no translation applies, else ``open``'s."""
        path = self.path_of(request)
        translator = None if self.mode == "never" or request.method != "POST" or path is None else TRANSLATORS.get(path)
        if translator is None or path is None:
            return await self.inner.handle_async_request(request)
        return await self.open(translator, path, request)

    async def open(self, translator: Translator, path: str, request: httpx.Request) -> httpx.Response:
        """The call's answer: the upstream's own, or (where it lacks ``path``) chat completions' translated.

        A failure once an answer has come (reading it) is the upstream breaking off its answer."""
        native = None
        if self.mode == "auto" and path not in self.lacking:
            native = await self.inner.handle_async_request(request)
            partial = _partial_front(path, native)
            if partial is None and native.status_code not in LACKING:
                checked, fault = await self._midway(_checked(translator, native, request))
                if fault is None:
                    self.native.add(path)
                    return checked
                partial = f"its {path} answered what is not the {translator.name} API ({fault})"
            if partial is not None:  # its answer is not used: the call goes as a chat completion, now and later
                await native.aclose()
                native = None
                self._translate_from_now(translator, path, partial)
            else:
                await self._midway(native.aread())  # a short error: kept, in case chat completions are missing too
                await native.aclose()
        asked = _decoded(await request.aread())
        body = translator.chat_body(asked)
        chat = await self.inner.handle_async_request(self._chat_request(request, json.dumps(body).encode()))
        if native is not None:
            if chat.status_code in LACKING:  # neither: the upstream's first answer stands
                await chat.aclose()
                return httpx.Response(
                    native.status_code, headers=native.headers, stream=httpx.ByteStream(native.content), request=request, extensions=native.extensions
                )
            self._translate_from_now(translator, path, f"it answered POST {path} with {native.status_code}")
        return await self._midway(translated(translator, asked, chat, request, streamed=bool(body.get("stream"))))

    def _chat_request(self, request: httpx.Request, body: bytes) -> httpx.Request:
        """The call as a chat completion: at the upstream's chat path, its headers a chat upstream's (``chat_headers``)."""
        url = request.url.copy_with(path=self.base_path + CHAT_PATH)
        return httpx.Request("POST", url, headers=chat_headers(request.headers), content=body, extensions=request.extensions)

    async def _midway(self, reading: Any) -> Any:
        """``reading`` awaited; an HTTP failure on the way is the upstream's, breaking off its answer."""
        try:
            return await reading
        except httpx.HTTPError as exc:
            raise as_upstream_error(exc, self.shown_url, midway=True) from None

    async def aclose(self) -> None:
        """Close the transport that reaches the upstream."""
        await self.inner.aclose()


KNOWN_PARTIAL = {"llama.cpp": ("/responses", "/messages")}


def _partial_front(path: str, native: httpx.Response) -> str | None:
    """Why the upstream's own ``path`` is not used, when its server is one known to speak it in part."""
    server = native.headers.get("server", "").lower()
    for name, paths in KNOWN_PARTIAL.items():
        if server.startswith(name) and path in paths:
            return f"the upstream is {name}, whose {path} is partial"
    return None


async def _checked(translator: Translator, native: httpx.Response, request: httpx.Request) -> tuple[httpx.Response, str | None]:
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
        return _replayed(native, read, chunks, request), fault
    if translator.name != "responses" or not kind.startswith("application/json"):
        return native, None
    body = await native.aread()
    try:
        response = json.loads(body)
    except ValueError:
        response = None
    replayed = httpx.Response(native.status_code, headers=native.headers, stream=httpx.ByteStream(body), request=request, extensions=native.extensions)
    return replayed, _ollama(response)


# Ollama names its responses "resp_" and a number under a million (OpenAI's: 48 hex digits), with a
# service_tier "default"; its own /v1/responses answers every tool_choice as "auto", and keeps no store
# nor metadata.
_OLLAMA_ID = re.compile(r"resp_\d{1,6}")


def _ollama(response: Any) -> str | None:
    """Why a response object shows Ollama's own /responses (None: it does not)."""
    response_id = response.get("id") if isinstance(response, dict) else None
    if isinstance(response_id, str) and _OLLAMA_ID.fullmatch(response_id) and response.get("service_tier") == "default":
        return "the upstream is Ollama (by its response ids), whose /responses is partial"
    return None


def _first_event_fault(name: str, read: bytes) -> str | None:
    """What shows that a stream's first event is not one of the API's (None: nothing does)."""
    event = None
    for line in read.replace(b"\r\n", b"\n").split(b"\n\n")[0].split(b"\n"):
        data = data_field(line)
        if data is not None:
            try:
                event = json.loads(data)
            except ValueError:
                event = None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return "its stream's first event has no type"
    if name == "responses" and not isinstance(event.get("sequence_number"), int):
        return "its events have no sequence_number"
    return _ollama(event.get("response")) if name == "responses" else None


def _replayed(native: httpx.Response, read: bytes, rest: AsyncIterator[bytes], request: httpx.Request) -> httpx.Response:
    """The upstream's own stream, whole again: what was read of it, then the rest."""
    return httpx.Response(native.status_code, headers=native.headers, stream=_Prefixed(read, rest, native), request=request, extensions=native.extensions)


class _Prefixed(httpx.AsyncByteStream):
    """What was read of a stream, then the rest of it; closing it closes the upstream's."""

    def __init__(self, read: bytes, rest: AsyncIterator[bytes], native: httpx.Response):
        self.read, self.rest, self.native = read, rest, native

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """What was read, then the rest as it comes."""
        if self.read:
            yield self.read
        async for chunk in self.rest:
            yield chunk

    async def aclose(self) -> None:
        """Close the upstream's stream."""
        await self.native.aclose()


def _decoded(content: bytes | None) -> dict[str, Any]:
    """The request's body as a JSON object, or the 400 that says it is not one."""
    try:
        asked = strict_json(content or b"")
    except (ValueError, RecursionError) as exc:
        raise ClientError(f"the request body is not JSON: {exc}", code="invalid_json") from None
    if not isinstance(asked, dict):
        raise ClientError("the request body is not a JSON object", code="invalid_json")
    return asked
