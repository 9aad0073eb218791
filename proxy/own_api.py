"""What every route of the proxy's own API (``/v1/pcp/…``) shares: ids checked, bodies read within a limit, JSON answered
(bodies are decoded by ``decoding.decode_stored``: JSON, UTF-8 and numbers a store keeps, or a 400).

Its routes sit under one router whose guard asks for a proxy key
(``web.keys.proxy_key``); each handler gets the caller's namespace and the
feature it serves by dependency injection (``proxy.app``), so one key never
reads or changes another's sessions or memory.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response

from pcp_core import SESSION_ID

from .errors import ClientError

__all__ = ["checked_session", "json_response", "limited_body", "too_large"]


def checked_session(value: str) -> str:
    """A session id from a path, or the 400 that says what one is."""
    if not SESSION_ID.fullmatch(value):
        raise ClientError("a session id is 1 to 128 letters, digits or . _ : -", param="session_id", code="invalid_session")
    return value


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
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
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} bytes"
