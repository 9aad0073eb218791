"""Every error the proxy returns uses the OpenAI envelope:
``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException

__all__ = ["ProxyError", "error_response", "exception_handlers"]

log = logging.getLogger("pcp.proxy")


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class Envelope(msgspec.Struct):
    error: ErrorBody


class ProxyError(Exception):
    """An error meant for the client, with the status and envelope fields to send.

    ``raw`` carries an upstream error body to pass through exactly as it came.
    """

    def __init__(self, status: int, message: str, type: str, *, param: str | None = None, code: str | None = None, raw: bytes | None = None, media_type: str = "application/json"):
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type, param=param, code=code)
        self.raw = raw
        self.media_type = media_type

    @classmethod
    def from_upstream(cls, status: int, body: bytes, media_type: str | None) -> ProxyError:
        return cls(status, body.decode(errors="replace")[:500], "upstream_error", raw=body, media_type=media_type or "application/json")

    def envelope(self) -> bytes:
        return self.raw if self.raw is not None else _ENCODER.encode(Envelope(self.body))

    @classmethod
    def bad_request(cls, message: str, *, param: str | None = None, code: str | None = None) -> ProxyError:
        return cls(400, message, "invalid_request_error", param=param, code=code)


_ENCODER = msgspec.json.Encoder()


def error_response(error: ProxyError, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(content=error.envelope(), status_code=error.status, media_type=error.media_type, headers=headers)


def _on_proxy_error(_: Request, exc: ProxyError) -> Response[bytes]:
    return error_response(exc)


_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def _on_http_exception(_: Request, exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    kind = _HTTP_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    detail = f"{exc.detail}: the body is larger than this proxy accepts (setting max_body_mb)" if status == 413 else exc.detail
    return error_response(ProxyError(status, detail, kind), headers=exc.headers)


def _on_unexpected(request: Request, exc: Exception) -> Response[bytes]:
    # The traceback goes to the log, never to the client.
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ProxyError(500, f"internal proxy error ({type(exc).__name__}); see the proxy log", "server_error"))


exception_handlers = {
    ProxyError: _on_proxy_error,
    HTTPException: _on_http_exception,
    Exception: _on_unexpected,
}
