"""WebSocket upgrades: refused with 426 Upgrade Required, so that a client that can fall back to HTTP does so at once.

The proxy pages HTTP calls; it does not relay WebSockets. Codex, with a
provider that ``supports_websockets``, first asks ``GET /v1/responses`` to
upgrade: refused with 426 it falls back to HTTPS after that one try, where a
403 (what a server answers a socket no route takes) or a 404 costs it seven
tries and ~7 s, and a 400 fails its turn.
"""

from __future__ import annotations

from typing import Any

from ..errors import ClientError

__all__ = ["refuse_websocket"]

REFUSED = ClientError(
    "this proxy does not relay WebSockets: send the call over HTTP (a Responses client: POST /v1/responses)",
    status=426,
    type="invalid_request_error",
    code="websocket_unsupported",
)


async def refuse_websocket(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answer a WebSocket handshake with a 426 in the API's error envelope; a server that cannot send a
    status for a handshake (no ``websocket.http.response`` extension) closes it, and answers 403."""
    await receive()  # websocket.connect
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    headers = [(b"content-type", b"application/json")]
    await send({"type": "websocket.http.response.start", "status": REFUSED.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": REFUSED.envelope()})
