"""What can go wrong, told by who failed: the client, the upstream, or the proxy itself.

Every error the proxy returns uses the OpenAI envelope
``{"error": {"message", "type", "param", "code"}}``, or Anthropic's
``{"type": "error", "error": {"type", "message"}}`` to a client of Anthropic's
API (``anthropic_envelope``); an upstream's own error body is passed on as it came. The web framework turns these into responses
(``proxy.app``); nothing here knows it.
"""

from __future__ import annotations

from typing import TypedDict, Unpack

import msgspec

__all__ = ["ClientClosed", "ClientError", "PcpError", "ProxyFault", "UpstreamError", "anthropic_envelope"]


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class Envelope(msgspec.Struct):
    error: ErrorBody


_ENCODER = msgspec.json.Encoder()


class PcpError(Exception):
    """An error meant for the client, with the status and envelope fields to send."""

    status = 500
    type = "server_error"

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status or self.status
        self.body = ErrorBody(message=message, type=type or self.type, param=param, code=code)
        self.media_type = "application/json"
        self.headers: dict[str, str] = {}  # sent with the error's response (the proxy's x-pcp-*, an upstream's Retry-After)

    def envelope(self) -> bytes:
        """The error's body in the API's error envelope."""
        return _ENCODER.encode(Envelope(self.body))


class ErrorFields(TypedDict, total=False):
    """``PcpError``'s fields beside the message, as a subclass passes them on."""

    status: int | None
    type: str | None
    param: str | None
    code: str | None


class ClientError(PcpError):
    """The request cannot be served as sent: a 4xx that says what to change."""

    status = 400
    type = "invalid_request_error"


class UpstreamError(PcpError):
    """The upstream failed, could not be reached or answered what cannot be read (502, 504),
    or refused the request: then its own status and body go back as they came (``raw``)."""

    status = 502
    type = "upstream_error"

    def __init__(self, message: str, *, raw: bytes | None = None, media_type: str | None = None, **fields: Unpack[ErrorFields]):
        super().__init__(message, **fields)
        self.raw = raw
        self.media_type = media_type or "application/json"

    @classmethod
    def refused(cls, status: int, body: bytes, media_type: str | None, retry_after: str | None = None) -> UpstreamError:
        """The upstream's own error response, to pass on with its status (and when to try again, if it says)."""
        error = cls(body.decode(errors="replace")[:500], status=status, raw=body, media_type=media_type)
        if retry_after:
            error.headers["retry-after"] = retry_after
        return error

    def envelope(self) -> bytes:
        """The upstream's own body where it refused the request, else the proxy's envelope."""
        return self.raw if self.raw is not None else super().envelope()


class ProxyFault(PcpError):
    """The proxy itself failed; the details go to its log, not to the client."""


class ClientClosed(PcpError):
    """The client went away before the answer; nothing is sent, the status only marks the access log."""

    status = 499
    type = "client_closed"


# Anthropic names an error by its kind, where OpenAI names it by type and code.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class AnthropicError(msgspec.Struct):
    type: str
    message: str


class AnthropicEnvelope(msgspec.Struct, tag="error", tag_field="type"):
    error: AnthropicError


def anthropic_envelope(error: PcpError) -> bytes:
    """``error`` as Anthropic's API says it (an upstream's own body as it came); the proxy's code ends the message."""
    raw = getattr(error, "raw", None)
    if raw is not None:
        return raw
    kind = ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    code = f" ({error.body.code})" if error.body.code else ""
    return _ENCODER.encode(AnthropicEnvelope(AnthropicError(kind, error.body.message + code)))
