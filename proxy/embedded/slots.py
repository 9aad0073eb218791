"""The way to the embedded server: its slots as a bounded queue, and its errors in the proxy's envelope.

llama-server runs as many generations at once as it has slots and queues the
rest without limit, and its health says ok all the while. In front of it the
proxy lets as many requests through as there are slots; one that finds them all
busy waits up to ``queue_timeout`` seconds for one, then gets a 503 with
``Retry-After`` rather than hanging. A slot is the proxy's again when the answer
is closed: read whole, or a stream ended or abandoned by its client (whose
connection closes, and llama-server stops generating). A chat completion asked
whole is asked for as a stream and put together here (``whole``): llama-server
notices at once a client that left a stream, late one that left a whole answer.

Its errors come back in the proxy's envelope ``{"error": {"message", "type",
"param", "code"}}``, as the proxy's own do: llama-server says ``"code": 400`` and
names the field only in its message.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec

from .whole import assembled, streamed_request

__all__ = ["BUSY_CODE", "RETRY_AFTER", "Slots", "enveloped"]

BUSY_CODE = "local_model_busy"
RETRY_AFTER = 5  # seconds a client told the model is busy is asked to wait
MAX_MESSAGE = 500
_FIELD = re.compile(r"Field '([^']+)'")
# llama-server's own error types, as OpenAI names them.
_CODES = {"exceed_context_size_error": ("invalid_request_error", "context_length_exceeded")}


class Slots:
    """At most ``count`` generations at once; a request waits ``queue_timeout`` seconds for a slot at most."""

    def __init__(self, count: int, queue_timeout: float, key: str):
        self.count = count
        self.queue_timeout = queue_timeout
        self.key = key  # the server's API key, sent on every call
        self.busy = 0  # requests generating
        self.waiting = 0  # requests waiting for a slot
        self._free = asyncio.Semaphore(count)

    def transport(self, inner: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        """``inner`` with the slots in front of it."""
        return _SlotTransport(inner, self)

    async def acquire(self) -> bool:
        """Take a slot; False once ``queue_timeout`` has passed without one."""
        self.waiting += 1
        try:
            async with asyncio.timeout(self.queue_timeout):
                await self._free.acquire()
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1
        self.busy += 1
        return True

    def release(self) -> None:
        """Give a slot back."""
        self.busy -= 1
        self._free.release()


class _SlotTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, slots: Slots):
        self.inner = inner
        self.slots = slots

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The call sent once a slot is free, with the server's key; a whole answer streamed, errors in the proxy's envelope."""
        request.headers["authorization"] = f"Bearer {self.slots.key}"  # the client's key is not the server's
        if request.method != "POST":  # models, health: no generation
            return await self.inner.handle_async_request(request)
        if not await self.slots.acquire():
            return _busy(self.slots, request)
        streamed = streamed_request(request)  # a whole answer, asked for as a stream (``whole``)
        try:
            response = await self.inner.handle_async_request(streamed or request)
        except BaseException:
            self.slots.release()
            raise
        if streamed is not None and response.status_code < 400:
            try:
                status, body = await assembled(response)
            finally:  # a client that left cancels this: the stream closes, and the generation stops
                await response.aclose()
                self.slots.release()
            content = body if status < 400 else enveloped(body, status)
            return httpx.Response(status, headers=_plain(response.headers), stream=httpx.ByteStream(content), request=request)
        if response.status_code >= 400:
            try:
                body = await response.aread()
            finally:
                await response.aclose()
                self.slots.release()
            return httpx.Response(
                response.status_code, headers=_plain(response.headers), stream=httpx.ByteStream(enveloped(body, response.status_code)), request=request
            )
        response.stream = _Released(response.stream, self.slots.release)
        return response

    async def aclose(self) -> None:
        """Close the transport that reaches the server."""
        await self.inner.aclose()


class _Released(httpx.AsyncByteStream):
    """A response's body that gives its slot back when it is closed, once."""

    def __init__(self, stream: Any, release: Callable[[], None]):
        self.stream = stream
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The body as it comes."""
        async for chunk in self.stream:
            yield chunk

    async def aclose(self) -> None:
        """Close the body, and give its slot back (once)."""
        try:
            await self.stream.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


def _busy(slots: Slots, request: httpx.Request) -> httpx.Response:
    """The 503 for a request that found no slot free in time, with when to retry."""
    message = (
        f"the embedded model is busy: its {slots.count} slots are generating and no slot came free within {slots.queue_timeout:g} s "
        "(settings local_slots, local_queue_timeout); retry later"
    )
    body = msgspec.json.encode({"error": {"message": message, "type": "server_error", "param": None, "code": BUSY_CODE}})
    return httpx.Response(503, headers={"content-type": "application/json", "retry-after": str(RETRY_AFTER)}, stream=httpx.ByteStream(body), request=request)


def _plain(headers: httpx.Headers) -> dict[str, str]:
    """The server's headers for a body the proxy wrote: JSON, its length its own."""
    return {k: v for k, v in headers.items() if k.lower() not in ("content-length", "content-encoding", "transfer-encoding", "content-type")} | {
        "content-type": "application/json"
    }


def enveloped(body: bytes, status: int) -> bytes:
    """llama-server's error ``body`` in the proxy's envelope: its message and type, the field it names as ``param``."""
    try:
        parsed = msgspec.json.decode(body)
    except msgspec.DecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    error = error if isinstance(error, dict) else {"message": body.decode(errors="replace").strip() or f"the embedded model answered {status}"}
    message = str(error.get("message") or f"the embedded model answered {status}")[:MAX_MESSAGE]
    kind = str(error.get("type") or ("invalid_request_error" if status < 500 else "server_error"))
    kind, code = _CODES.get(kind, (kind, error.get("code") if isinstance(error.get("code"), str) else None))
    field = _FIELD.search(message)
    return msgspec.json.encode({"error": {"message": message, "type": kind, "param": field.group(1) if field else None, "code": code}})
