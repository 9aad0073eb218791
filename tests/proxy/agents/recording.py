"""A proxy on loopback for real agents, in front of the scripted upstream, recording every answer the agents get.

``Recording`` wraps the proxy's ASGI app: each exchange keeps the request's
line and headers and the response's status, headers and body as they went out,
so a test checks what the agent saw (``seen_problems``): no 5xx, no empty 200,
no stream without its terminal event, no ``<PagedContext>`` and no directive.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.app import create_app
from proxy.cli.server import server_options
from proxy.settings import Settings
from proxy.testing.agent_upstream import AgentScript
from proxy.testing.upstream import FakeUpstream, serve_in_thread

__all__ = ["AgentProxy", "Exchange", "agent_proxy", "seen_problems"]

PAGED = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}
TERMINAL = {"chat": b"data: [DONE]", "responses": b"event: response.completed", "messages": b"event: message_stop"}
# What the proxy's own prompt and directives look like: none of it may reach an agent.
LEAKS = re.compile(rb"<PagedContext|</?Query>|<Linear_Flow|<Static_Registry|<Node |\"name\":\s*\"(?:Consult|Explore|Shelve)\"|\b(?:Consult|Explore|Shelve)\(")


@dataclass
class Exchange:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    websocket: bool = False

    @property
    def api(self) -> str | None:
        """The paged API the exchange is a call of, or None."""
        return PAGED.get(self.path) if self.method == "POST" else None

    @property
    def mode(self) -> str:
        return self.response_headers.get("x-pcp-mode", "")


class Recording:
    """An ASGI app that hands every request to ``app`` and keeps the exchange."""

    def __init__(self, app: Any):
        self.app = app
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        exchange = Exchange(
            scope.get("method", "GET"), scope["path"], scope.get("query_string", b"").decode("latin-1"), headers, websocket=scope["type"] == "websocket"
        )

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                exchange.status = message["status"]
                exchange.response_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
            elif message["type"] in ("http.response.body", "websocket.http.response.body"):
                exchange.body += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            with self._lock:
                self.exchanges.append(exchange)


@dataclass
class AgentProxy:
    url: str
    recording: Recording
    script: AgentScript
    app: Any

    @property
    def exchanges(self) -> list[Exchange]:
        return list(self.recording.exchanges)


@contextmanager
def agent_proxy(data: Path, script: AgentScript, **settings: Any) -> Iterator[AgentProxy]:
    """The proxy on loopback (uvicorn, as ``pcp-proxy serve`` runs it) in front of ``script``, which it reaches in process."""
    upstream = FakeUpstream(script)
    proxy_settings = Settings(upstream_base_url=upstream.url, data_dir=str(data), router_embeddings=False, **settings)
    app = create_app(proxy_settings, transport=upstream.transport())
    recording = Recording(app)
    server = serve_in_thread(recording, **server_options(proxy_settings))
    try:
        yield AgentProxy(server.url, recording, script, app)
    finally:
        server.stop()


def seen_problems(exchanges: list[Exchange]) -> list[str]:
    """What an agent should never see: a 5xx, an empty 200, a stream without its terminal event, the proxy's prompt or a directive."""
    problems = []
    for n, e in enumerate(exchanges):
        said = f"#{n} {e.method} {e.path} -> {e.status} ({e.mode or '-'})"
        if e.status >= 500:
            problems.append(f"{said}: a 5xx: {e.body[:300]!r}")
        if e.status == 200 and not e.body and e.method != "HEAD":
            problems.append(f"{said}: an empty 200")
        streamed = e.api and e.status == 200 and e.response_headers.get("content-type", "").startswith("text/event-stream")
        if streamed and TERMINAL[e.api] not in e.body:
            problems.append(f"{said}: a stream without {TERMINAL[e.api].decode()}: …{e.body[-300:]!r}")
        leak = LEAKS.search(e.body)
        if leak:
            problems.append(f"{said}: the proxy's own text reached the agent: {leak.group(0)!r} in …{e.body[max(0, leak.start() - 100) : leak.end() + 100]!r}")
    return problems
