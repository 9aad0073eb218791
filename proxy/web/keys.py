"""Who may call the proxy, and which credentials its upstream sees.

With ``PCP_API_KEYS`` every ``/v1`` route asks for a proxy key (``proxy_key``, a
guard on its routers); a proxy key is the proxy's and never travels upstream.
``/metrics`` takes the metrics key, else any proxy key; ``/healthz`` answers
anyone, and says more only to a proxy key.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from ..errors import ClientError
from ..settings import Settings
from ..upstream import forwardable

__all__ = ["check_metrics_key", "proxy_key", "shows_details", "upstream_headers"]


def proxy_key(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """A guard: the request presents one of the proxy's keys, when it has keys."""
    keys = connection.app.state.services.settings.api_keys
    if keys:
        _check_key(connection.headers.get("authorization", ""), keys)


def upstream_headers(settings: Settings, client_headers: Mapping[str, str], anthropic: bool = False) -> dict[str, str]:
    """The client's headers as the upstream sees them: the Authorization the upstream should get
    (``anthropic``: the call goes to a separate Anthropic upstream, which never gets the upstream key)."""
    headers = forwardable(client_headers)
    for name, value in headers.items():
        if not value.isascii():  # httpx sends ASCII only; a proxy that re-encoded it would be guessing
            raise ClientError(
                f"header {name} holds characters that are not ASCII: encode its value (RFC 8187, or percent-encoding)", param=str(name), code="invalid_header"
            )
    if settings.api_keys:
        headers.pop("authorization", None)  # a proxy key is ours: it never travels upstream
    if settings.upstream_api_key and not (anthropic and settings.anthropic_base_url):
        headers["authorization"] = f"Bearer {settings.upstream_api_key}"
    return headers


def check_metrics_key(settings: Settings, client_headers: Mapping[str, str]) -> None:
    """/metrics is open to the metrics key if there is one, else to any proxy key, else to all."""
    keys = [settings.metrics_key] if settings.metrics_key else settings.api_keys
    if keys:
        _check_key(client_headers.get("authorization", ""), keys)


def shows_details(settings: Settings, client_headers: Mapping[str, str]) -> bool:
    """Whether /healthz may say more than that the proxy is alive: to a proxy key, when there are keys."""
    try:
        if settings.api_keys:
            _check_key(client_headers.get("authorization", ""), settings.api_keys)
    except ClientError:
        return False
    return True


def _check_key(authorization: str, keys: list[str]) -> None:
    """Raise the 401 or 403 that says what is wrong with the presented proxy key, if anything is."""
    scheme, _, key = authorization.partition(" ")
    presented = key.strip().encode() if scheme.lower() == "bearer" else b""
    if not presented:
        raise ClientError("this proxy requires an API key: send 'Authorization: Bearer <key>'", status=401, code="missing_api_key")
    if not any(hmac.compare_digest(presented, k.encode()) for k in keys):
        raise ClientError("the API key presented is not valid for this proxy", status=401, code="invalid_api_key")
