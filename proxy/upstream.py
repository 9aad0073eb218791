"""The one pooled HTTP client to the upstream model, and what its failures mean to a client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any

import httpx
import msgspec

from .errors import UpstreamError

__all__ = ["Upstream", "HOP_BY_HOP", "forwardable"]

# Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus
# the ones each side computes for itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "date",
        "server",
    }
)


# What the proxy reads of the upstream's answers in protocol mode. An answer is
# checked against these shapes before it is read, so a malformed one is a 502
# that says what was wrong where, not a failure inside the proxy. Fields not
# named here are not checked: the answer is passed on as it came.
class _Function(msgspec.Struct):
    name: str | None = None
    arguments: Any = None  # a JSON string by the API; anything else reads as a malformed directive


class _ToolCall(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: _Function = msgspec.field(default_factory=_Function)


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class _Choice(msgspec.Struct):
    message: _Message


class _Completion(msgspec.Struct):
    choices: Annotated[list[_Choice], msgspec.Meta(min_length=1)]
    usage: _Usage | None = None


class _ChunkChoice(msgspec.Struct):
    delta: _Message = msgspec.field(default_factory=_Message)


class _Chunk(msgspec.Struct):
    choices: list[_ChunkChoice] | None = None
    usage: _Usage | None = None


def _checked(text: str | bytes, shape: type, what: str, code: str) -> dict[str, Any]:
    """``text`` decoded, once it is known to have ``shape``; else the 502 that says where it differs."""
    try:
        data = msgspec.json.decode(text)  # strict JSON: no NaN, no number past a double's range
        msgspec.convert(data, shape)
    except (ValueError, RecursionError, msgspec.MsgspecError) as exc:
        raise UpstreamError(f"the upstream's answer is not {what} ({exc}): {text[:200]!r}", code=code) from None
    return data


def forwardable(headers: Mapping[str, str] | httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


class Upstream:
    """``transport``: how requests reach the upstream (httpx's own by default; tests plug one in)."""

    def __init__(self, base_url: str, *, connect_timeout: float, read_timeout: float, transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        # How the upstream is named to clients (errors, /healthz): without credentials
        # the URL may carry (https://user:key@host/v1, ?api-key=…).
        self.shown_url = str(httpx.URL(self.base_url).copy_with(username=None, password=None, query=None))
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            # Many concurrent long generations are normal for a proxy.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            # The proxy relays bytes as they came; it never decodes what it forwards.
            headers={"accept-encoding": "identity"},
            transport=transport,
        )

    async def open(self, method: str, path: str, *, content: bytes | None, headers: Mapping[str, str], timeout: float | None = None) -> httpx.Response:
        """Send a request and return the response with its body not yet read.

        A connection the upstream closed or reset without a word (typically a
        pooled one its keep-alive timeout had just ended) is tried once more.
        ``timeout`` (seconds) overrides the configured connect and read timeouts.
        """
        for attempt in range(2):
            request = self.client.build_request(method, path, content=content, headers=headers, timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)
            try:
                return await self.client.send(request, stream=True)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:  # before any response
                if attempt:
                    raise _as_upstream_error(exc, self.shown_url) from None
            except httpx.HTTPError as exc:
                raise _as_upstream_error(exc, self.shown_url) from None
        raise AssertionError("unreachable")

    async def complete(self, content: bytes, headers: Mapping[str, str], timeout: float | None = None) -> dict[str, Any]:
        """POST a non-streamed chat completion and decode it; an error status raises as the upstream sent it."""
        response = await self.open("POST", "/chat/completions", content=content, headers=headers, timeout=timeout)
        body = await self.read(response)
        if response.status_code >= 400:
            raise UpstreamError.refused(response.status_code, body, response.headers.get("content-type"))
        return _checked(body, _Completion, "a chat completion", "upstream_bad_response")

    async def read(self, response: httpx.Response) -> bytes:
        try:
            return b"".join([chunk async for chunk in response.aiter_raw()])
        except httpx.HTTPError as exc:
            raise _as_upstream_error(exc, self.shown_url) from None
        finally:
            await response.aclose()

    async def relay(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """Yield the raw body as it arrives; closing the iterator closes the upstream stream."""
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    async def sse_events(self, response: httpx.Response) -> AsyncIterator[dict]:
        """Decode an SSE chat stream into its JSON chunks; closes the response at the end."""
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                yield _checked(data, _Chunk, "a chat completion chunk", "upstream_bad_stream")
        except httpx.HTTPError as exc:
            raise _as_upstream_error(exc, self.shown_url) from None
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self.client.aclose()


def _as_upstream_error(exc: httpx.HTTPError, base_url: str) -> UpstreamError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamError(f"the upstream at {base_url} did not answer in time ({type(exc).__name__})", status=504, type="upstream_timeout", code="upstream_timeout")
    return UpstreamError(f"the upstream at {base_url} could not be reached: {str(exc) or type(exc).__name__}", code="upstream_unreachable")
