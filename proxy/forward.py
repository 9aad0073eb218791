"""Passthrough: a request forwarded upstream as it came, and its answer relayed as it comes.

A client that disconnects cancels the upstream request, streaming or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import httpx
from litestar import Request, Response
from litestar.response import Stream

from .errors import ClientClosed
from .upstream import Upstream, forwardable

__all__ = ["forward", "unless_client_leaves"]

T = TypeVar("T")


async def forward(
    upstream: Upstream,
    request: Request[Any, Any, Any],
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    pcp_headers: dict[str, str],
    *,
    stream: bool = False,
) -> Response[Any]:
    if stream:
        # The response starts with the upstream's first chunk: until then a failure is a status.
        # Litestar cancels the relay when the client disconnects; the relay's
        # finally then closes the upstream stream, which cancels the generation.
        response, chunks = await unless_client_leaves(request, _started(upstream, method, path, body, headers))
        return Stream(chunks, **_relayed(response, pcp_headers))

    async def exchange() -> tuple[httpx.Response, bytes]:
        response = await upstream.open(method, path, content=body, headers=headers)
        return response, await upstream.read(response)

    response, content = await unless_client_leaves(request, exchange())
    return Response(content, **_relayed(response, pcp_headers))


async def _started(upstream: Upstream, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[httpx.Response, AsyncIterator[bytes]]:
    response = await upstream.open(method, path, content=body, headers=headers)
    return response, await upstream.started(response)


def _relayed(response: httpx.Response, pcp_headers: dict[str, str]) -> dict[str, Any]:
    headers = forwardable(response.headers)
    media_type = headers.pop("content-type", None) or headers.pop("Content-Type", None)
    headers.update(pcp_headers)
    return {"status_code": response.status_code, "headers": headers, "media_type": media_type}


async def unless_client_leaves(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client disconnects first."""
    handler = asyncio.current_task()
    assert handler is not None
    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(lambda w: w.cancelled() or handler.cancel())
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            raise ClientClosed("client closed the connection") from None
        raise
    finally:
        watcher.cancel()


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
