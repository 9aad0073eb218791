"""Errors as responses: every failure in the API's own envelope, never a traceback."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException

from ..errors import ClientError, PcpError, ProxyFault, anthropic_envelope

__all__ = ["EXCEPTION_HANDLERS", "error_response", "not_the_proxys", "speaks_anthropic"]

log = logging.getLogger("pcp.proxy")

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def speaks_anthropic(request: Request[Any, Any, Any]) -> bool:
    """A client of Anthropic's API: its calls go to Anthropic's upstream, its errors are in Anthropic's envelope."""
    path = request.url.path
    return path == "/v1/messages" or path.startswith("/v1/messages/") or "anthropic-version" in request.headers


def not_the_proxys(path: str) -> ClientError:
    """A path under /v1/pcp/ that names none of the proxy's own routes."""
    return ClientError(f"{path} is not a route of this proxy: /v1/pcp/ is reserved for its own API", status=404, type="not_found_error", code="unknown_url")


def error_response(error: PcpError, headers: dict[str, str] | None = None, anthropic: bool = False) -> Response[bytes]:
    """``error`` in the API's envelope (Anthropic's for a client of its API), with ``headers``."""
    content = anthropic_envelope(error) if anthropic else error.envelope()
    return Response(content=content, status_code=error.status, media_type=error.media_type, headers=headers)


def _on_pcp_error(request: Request[Any, Any, Any], exc: PcpError) -> Response[bytes]:
    """A ``PcpError`` as the response it says."""
    return error_response(exc, exc.headers or None, anthropic=speaks_anthropic(request))


def _on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    """Litestar's own HTTP errors (404, 405, 413…) in the API's envelope."""
    status = exc.status_code
    if status == 404 and (request.url.path + "/").startswith("/v1/pcp/"):  # beside one of its routes, the router answers itself
        return error_response(not_the_proxys(request.url.path))
    kind = _HTTP_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    detail = f"{exc.detail}: the body is larger than this proxy accepts (setting max_body_mb)" if status == 413 else exc.detail
    return error_response(PcpError(detail, status=status, type=kind), headers=exc.headers, anthropic=speaks_anthropic(request))


def _on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    # The traceback goes to the log, never to the client.
    """Any other failure: a 500 that names the proxy, its traceback in the log only."""
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ProxyFault(f"internal proxy error ({type(exc).__name__}); see the proxy log"), anthropic=speaks_anthropic(request))


EXCEPTION_HANDLERS: dict[Any, Any] = {PcpError: _on_pcp_error, HTTPException: _on_http_exception, Exception: _on_unexpected}
