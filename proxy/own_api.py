"""What every route of the proxy's own API (``/v1/pcp/…``) shares: ids checked, JSON answered (bodies are decoded by ``decoding.decode_json``).

Its routes sit under one router whose guard asks for a proxy key
(``web.keys.proxy_key``); each handler gets the caller's namespace and the
feature it serves by dependency injection (``proxy.app``), so one key never
reads or changes another's sessions or memory.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Response

from pcp_core import SESSION_ID

from .errors import ClientError

__all__ = ["checked_session", "json_response"]


def checked_session(value: str) -> str:
    """A session id from a path, or the 400 that says what one is."""
    if not SESSION_ID.fullmatch(value):
        raise ClientError("a session id is 1 to 128 letters, digits or . _ : -", param="session_id", code="invalid_session")
    return value


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(msgspec.json.encode(content), status_code=status, media_type="application/json", headers=headers)
