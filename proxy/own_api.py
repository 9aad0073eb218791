"""What every route of the proxy's own API (``/v1/pcp/…``) shares: ids checked, bodies read within a limit, JSON answered
(bodies are decoded by ``decoding.decode_stored``: JSON, UTF-8 and numbers a store keeps, or a 400).

Its routes sit under one router whose guard asks for a proxy key
(``web.keys.proxy_key``); each handler gets the caller's namespace and the
feature it serves by dependency injection (``proxy.app``), so one key never
reads or changes another's sessions or memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Request, Response

from pcp_core import SESSION_ID

from .errors import ClientError

__all__ = ["SessionCheck", "checked_session", "existing_session", "json_response", "limited_body", "session_not_found", "too_large"]


# A route's check that a session id from its path names one of the caller's: ``existing_session`` on the proxy's
# services, handed to the routes by dependency injection (``known_session``), so that they need not know the services.
SessionCheck = Callable[[str, str], Awaitable[str]]


def checked_session(value: str) -> str:
    """A session id from a path, or the 400 that says what one is."""
    if not SESSION_ID.fullmatch(value):
        raise ClientError("a session id is 1 to 128 letters, digits or . _ : -", param="session_id", code="invalid_session")
    return value


def session_not_found(session_id: str) -> ClientError:
    """The 404 for a session id the caller has no session of."""
    return ClientError(f"no session {session_id!r} for this key", status=404, type="not_found_error", param="session_id", code="session_not_found")


async def existing_session(services: Any, namespace: str, value: str) -> str:
    """A session id from a path, of a session the caller has: else the 400 (not an id) or the 404 (no such session).

    A session is the caller's once the proxy keeps anything of it under the caller's
    namespace: its pages, components or Hybrid state; or a request named it lately
    (in passthrough, where nothing is kept until it has components).
    """
    session_id = checked_session(value)
    if not await asyncio.to_thread(_exists, services, namespace, session_id):
        raise session_not_found(session_id)
    return session_id


def _exists(services: Any, namespace: str, session_id: str) -> bool:
    """Whether the caller keeps anything of the session: its pages, components or Hybrid state, or named it lately."""
    components = services.components.store
    return bool(
        services.sessions.holds(namespace, session_id)
        or components.holds(namespace, session_id)
        or components.named_lately(namespace, session_id)
        or services.hybrid.store.holds(namespace, session_id)
    )


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
    """``content`` as a JSON response."""
    return Response(msgspec.json.encode(content), status_code=status, media_type="application/json", headers=headers)


def too_large(what: str, size: str, limit: str, setting: str) -> ClientError:
    """The 413 for something over one of the own API's limits, naming the setting that sets it."""
    return ClientError(f"{what} is {size}, over the limit of {limit} (setting {setting})", status=413, param=setting, code="limit_exceeded")


async def limited_body(request: Request[Any, Any, Any], limit: int, setting: str, what: str = "the request body") -> bytes:
    """The request's body, read up to ``limit`` bytes: past them a 413 that names ``setting``, before the rest is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(what, _bytes(int(declared)), _bytes(limit), setting)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(what, f"over {_bytes(limit)}", _bytes(limit), setting)
        chunks.append(chunk)
    return b"".join(chunks)


def _bytes(n: int) -> str:
    """A size in bytes as people read it (KiB, MiB)."""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} bytes"
