"""``create_app(settings)``: the Litestar application, its routers, and how handlers get what they need.

The lifespan opens the services (``services.open_services``) and closes them
at shutdown. Handlers ask for them by name (``services``, or a feature's:
``memory``, ``components``, ``hybrid``, ``sessions``, ``traces``,
``tokenizer``; ``namespace``, the caller's), and Litestar's dependency
injection hands them over. Every ``/v1`` route sits behind the proxy key
(``web.keys.proxy_key``); ``/healthz``, ``/metrics`` and the inspector's page
do not.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from litestar import Litestar, Request, Router
from litestar.datastructures import State
from litestar.di import Provide

from .hybrid.api import HYBRID_ROUTES
from .inspector import INSPECTOR_API, INSPECTOR_PAGES
from .memory.api import MEMORY_ROUTES
from .own_api import SessionCheck, existing_session
from .pact.api import COMPONENT_ROUTES
from .services import DenseRecall, Services, open_services
from .settings import Settings
from .tokenizer import Tokenizer
from .web.cors import UpstreamCorsDropped, cors_config
from .web.error_handlers import EXCEPTION_HANDLERS
from .web.keys import proxy_key
from .web.routes import API_ROUTES, OPEN_ROUTES, RESERVED
from .web.websockets import refuse_websocket

__all__ = ["Proxy", "create_app"]


def create_app(
    settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None, embedder: DenseRecall | None = None, tokenizer: Tokenizer | None = None
) -> Litestar:
    """The proxy. ``transport`` carries its upstream calls (httpx's own by default);
    ``embedder`` stands in for the one ``router_embeddings`` would load, ``tokenizer`` for the settings'."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        """The services open while the app serves, closed when it stops."""
        async with open_services(settings, transport=transport, embedder=embedder, tokenizer=tokenizer) as services:
            app.state.services = services
            yield

    own_api = Router("/v1/pcp", route_handlers=[*COMPONENT_ROUTES, *HYBRID_ROUTES, *MEMORY_ROUTES, *INSPECTOR_API, RESERVED], guards=[proxy_key])
    apis = Router("/v1", route_handlers=API_ROUTES, guards=[proxy_key])
    return Proxy(
        route_handlers=[apis, own_api, *OPEN_ROUTES, *INSPECTOR_PAGES],
        dependencies=DEPENDENCIES,
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_mb * 2**20,
        cors_config=cors_config(settings.cors_origins),
        middleware=[UpstreamCorsDropped] if settings.cors_origins else [],
        state=State({"settings": settings}),
        openapi_config=None,
        logging_config=None,
    )


class Proxy(Litestar):
    """The Litestar application, but for WebSocket upgrades: no route takes one (``web.websockets``)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await refuse_websocket(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _services(state: State) -> Services:
    """The proxy's services, for a route that needs them all."""
    return state.services


def _feature(name: str) -> Provide:
    """The dependency that hands a route one of the services, by name."""

    def provide(state: State) -> Any:
        """The service named."""
        return getattr(state.services, name)

    return Provide(provide, sync_to_thread=False)


def _known_session(state: State) -> SessionCheck:
    """The check that a session id names one of the caller's, on the proxy's services (``own_api.existing_session``)."""
    return functools.partial(existing_session, state.services)


def _namespace(request: Request[Any, Any, Any], state: State) -> str:
    """The caller's namespace: a keyed hash of its key, under which its sessions and memory are named."""
    return state.services.namespaces.of(request.headers)


DEPENDENCIES = {
    "services": Provide(_services, sync_to_thread=False),
    "namespace": Provide(_namespace, sync_to_thread=False),
    "known_session": Provide(_known_session, sync_to_thread=False),
    **{name: _feature(name) for name in ("memory", "components", "hybrid", "sessions", "traces", "tokenizer")},
}
