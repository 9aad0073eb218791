"""Requests from web pages of other origins (CORS), for apps that call the API from a browser.

Off unless ``PCP_CORS_ORIGINS`` names origins (or ``*``): a proxy on loopback
that answered any page would let every site its user visits spend the
upstream's key. When on, Litestar's CORS middleware answers preflights (before
proxy keys are checked: a browser sends none with them) and marks responses;
the upstream's own ``access-control-*`` headers are dropped first, so that the
proxy's policy is the only one a browser reads.
"""

from __future__ import annotations

from litestar.config.cors import CORSConfig
from litestar.datastructures import MutableScopeHeaders
from litestar.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["UpstreamCorsDropped", "cors_config"]


def cors_config(origins: list[str]) -> CORSConfig | None:
    """Litestar's CORS for these origins; None: no browser page may call the proxy."""
    if not origins:
        return None
    # Every header may be read by the page: the proxy's x-pcp-*, the upstream's request id and rate limits.
    return CORSConfig(allow_origins=origins, allow_methods=["*"], allow_headers=["*"], expose_headers=["*"], max_age=600)


class UpstreamCorsDropped:
    """ASGI middleware: a response leaves without the ``access-control-*`` headers it came with."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve an HTTP request with the upstream's CORS headers dropped from its answer."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def dropped(message: Message) -> None:
            """Send ``message`` without the upstream's own CORS headers."""
            if message["type"] == "http.response.start":
                headers = MutableScopeHeaders.from_message(message=message)
                for name in [k for k in headers if k.lower().startswith("access-control-")]:
                    del headers[name]
            await send(message)

        await self.app(scope, receive, dropped)
