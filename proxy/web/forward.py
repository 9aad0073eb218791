"""Passthrough: a request forwarded upstream as it came, and its answer relayed as it comes.

Every ``/v1`` path the proxy does not page is forwarded so: method, path,
query string, headers and body as the client sent them. A client that
disconnects cancels the upstream request, streaming or not.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote

import httpx
from litestar import Request, Response
from litestar.response import Stream

from ..errors import ClientClosed, ClientError, UpstreamError
from ..protocol.refusals import Refusal, TooLong
from ..sse import is_event_stream
from ..upstream import Failure, Upstream, forwardable

__all__ = ["Rewrite", "forward", "relayed", "upstream_target", "unless_client_leaves"]

T = TypeVar("T")


class Rewrite(Protocol):
    """What changes a successful answer on its way to the client: read whole, or as a stream."""

    async def whole(self, content: bytes) -> bytes:
        """The answer's body, rewritten whole."""

    def stream(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The answer's chunks, rewritten as they come."""


# An answer longer than this, or of unknown length, is relayed as it arrives rather than read whole first.
WHOLE_BYTES = 1 << 20
_SEPARATORS = re.compile(r"[/\\]")


async def forward(
    upstream: Upstream,
    request: Request[Any, Any, Any],
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    pcp_headers: dict[str, str],
    *,
    stream: bool | None,
    failure: Failure,
    rewrite: Rewrite | None = None,
    as_stream: Callable[[bytes], bytes] | None = None,
    too_long: Callable[[bytes], Refusal | None] | None = None,
) -> Response[Any]:
    """``path`` (below the upstream's base URL) forwarded; ``stream`` None: relayed as the answer comes
    when it is an event stream, of unknown length or large, else read whole (a cheaper response).
    ``rewrite``: what changes a successful answer on its way (Hybrid mode's); without it, it goes as it came.
    ``failure``: how a stream that fails midway says so (an error event of the client's API).
    ``as_stream``: a streamed call's answer that came whole (a server that ignores ``stream``) as the
    API's event stream, which the client asked for.
    ``too_long``: what a refusal of the prompt as longer than the model's window says (``protocol.refusals``);
    ``TooLong`` is then raised in place of the refusal, for the caller to page the request."""
    if stream:
        # The response starts with the upstream's first chunk: until then a failure is a status.
        # Litestar cancels the relay when the client disconnects; the relay's
        # finally then closes the upstream stream, which cancels the generation.
        response, chunks = await unless_client_leaves(request, _started(upstream, method, path, body, headers, failure, as_stream, too_long))
        if rewrite is not None and response.status_code < 300:
            chunks = rewrite.stream(chunks)
        return Stream(chunks, **relayed(response, pcp_headers))

    async def exchange() -> tuple[httpx.Response, bytes | AsyncIterator[bytes]]:
        """The upstream call: its answer, and its body read whole or started as chunks."""
        response = await upstream.open(method, path, content=body, headers=headers)
        refusal = await _refusal(upstream, response, too_long)
        if refusal is not None:
            return response, refusal
        if stream is None and _relayed_as_it_comes(response):
            return response, await upstream.started(response, failure)  # until its first chunk, a failure is a status
        return response, await upstream.read(response)

    response, content = await unless_client_leaves(request, exchange())
    if not isinstance(content, bytes):
        length = response.headers.get("content-length")
        return Stream(content, **relayed(response, {**pcp_headers, **({"content-length": length} if length else {})}))
    if rewrite is not None and response.status_code < 300:
        content = await rewrite.whole(content)
    return Response(content, **relayed(response, pcp_headers))


# The statuses a refusal of a prompt longer than the window comes with (Anthropic's, OpenAI's, llama.cpp's: 400).
REFUSED = (400, 413)


async def _refusal(upstream: Upstream, response: httpx.Response, too_long: Callable[[bytes], Refusal | None] | None) -> bytes | None:
    """A refusal's body, read whole, where the caller looks for one of a prompt too long (raised as ``TooLong``); else None."""
    if too_long is None or response.status_code not in REFUSED:
        return None
    content = await upstream.read(response)
    refusal = too_long(content)
    if refusal is not None:
        raise TooLong(refusal)
    return content


def _relayed_as_it_comes(response: httpx.Response) -> bool:
    """Whether an answer is relayed chunk by chunk (an event stream, no length, or a large one) rather than read whole."""
    length = response.headers.get("content-length")
    event_stream = response.headers.get("content-type", "").startswith("text/event-stream")
    return event_stream or length is None or not length.isdigit() or int(length) > WHOLE_BYTES


async def _started(
    upstream: Upstream,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    failure: Failure,
    as_stream: Callable[[bytes], bytes] | None,
    too_long: Callable[[bytes], Refusal | None] | None,
) -> tuple[httpx.Response, AsyncIterator[bytes]]:
    """The upstream's answer opened, and its body as chunks: as they come, or (``as_stream``) read whole and turned into events."""
    response = await upstream.open(method, path, content=body, headers=headers)
    refusal = await _refusal(upstream, response, too_long)
    if refusal is not None:
        return response, _once(refusal)
    if as_stream is None or response.status_code >= 300 or is_event_stream(response.headers.get("content-type")):
        return response, await upstream.started(response, failure)
    whole = await upstream.read(response)
    try:
        events = as_stream(whole)
    except UpstreamError:  # not an answer of the API: the client gets it as it came
        return response, _once(whole)
    response.headers["content-type"] = "text/event-stream; charset=utf-8"
    return response, _once(events)


async def _once(content: bytes) -> AsyncIterator[bytes]:
    """``content`` as one chunk."""
    yield content


def relayed(response: httpx.Response, pcp_headers: dict[str, str]) -> dict[str, Any]:
    """Litestar's response arguments for an upstream answer: its status, its forwardable headers and the proxy's."""
    headers = forwardable(response.headers)
    media_type = headers.pop("content-type", None) or headers.pop("Content-Type", None)
    headers.update(pcp_headers)
    return {"status_code": response.status_code, "headers": headers, "media_type": media_type}


def upstream_target(scope: Mapping[str, Any], prefix: bytes = b"/v1") -> str:
    """The path and query string the client asked for, below ``prefix``, as it sent them (still percent-encoded).

    A segment that is, once decoded, "." or ".." ("%2e%2e", "..%2f..") would
    climb out of the upstream's base URL to any path of its host, with the
    proxy's upstream key; an empty one ("//host") would name another host.
    Either is refused.
    """
    raw, _, query = bytes(scope.get("raw_path") or scope["path"].encode()).partition(b"?")
    query = query or scope.get("query_string") or b""
    path = raw[len(prefix) :].decode("latin-1")
    segments = path.split("/")[1:]
    for i, segment in enumerate(segments):
        decoded = unquote(segment)
        if (segment == "" and i < len(segments) - 1) or any(piece in (".", "..") for piece in _SEPARATORS.split(decoded)):
            raise ClientError(f"invalid path {path!r}: a segment is empty, '.' or '..'", param="path")
    return path + ("?" + query.decode("latin-1") if query else "")


# Most answers come sooner: they never pay for a watcher (a task a request).
WATCH_AFTER = 0.05


async def unless_client_leaves(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client disconnects first (noticed from ``WATCH_AFTER`` seconds on)."""
    handler = asyncio.current_task()
    assert handler is not None
    watchers: list[asyncio.Future[None]] = []

    def watch() -> None:
        """Cancel the request's handler when its client disconnects."""
        watcher = asyncio.ensure_future(_disconnected(request))
        watcher.add_done_callback(lambda w: w.cancelled() or handler.cancel())
        watchers.append(watcher)

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER, watch)
    try:
        return await work
    except asyncio.CancelledError:
        if any(w.done() and not w.cancelled() for w in watchers):
            raise ClientClosed("client closed the connection") from None
        raise
    finally:
        timer.cancel()
        for watcher in watchers:
            watcher.cancel()


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Until the client goes away."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
