"""How uvicorn serves the proxy: how large a request's head may be, and how long a client may take to send its request.

uvicorn with httptools takes a head of any size and waits for a body for
ever: an 8 MB header was read and forwarded upstream, and a client that
announced 1,000 bytes and sent 10 held its connection until it closed it.
``GuardedHttpTools`` refuses a head over ``max_header_kb`` (431) and a request
not whole within ``client_timeout`` of its first byte (408), in the
envelope, and closes the connection (one that sends nothing at all is
closed after ``client_timeout``); what httptools cannot parse is a 400
in the envelope too. An idle kept-alive connection is
uvicorn's to close (``timeout_keep_alive``). Without httptools, h11 bounds
the head (``h11_max_incomplete_event_size``) but not the time.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..errors import ClientError
from ..settings import Settings

__all__ = ["server_options"]

_HEAD_END = b"\r\n\r\n"

if TYPE_CHECKING:  # what the mixin's super() calls reach once it is mixed in
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Mixed
else:
    _Mixed = object


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the proxy (beside host, port and logging)."""
    max_head = settings.max_header_kb * 1024
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed: h11 bounds the head, not the time
        return {"http": "h11", "h11_max_incomplete_event_size": max_head}
    guarded = type("GuardedHttpTools", (_Guard, HttpToolsProtocol), {"max_head": max_head, "client_timeout": settings.client_timeout})
    return {"http": guarded, "h11_max_incomplete_event_size": max_head}


class _Guard(_Mixed):
    """Mixed into uvicorn's HttpToolsProtocol: counts a request's head as it arrives and times the request."""

    max_head: int
    client_timeout: float
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any

    # asyncio's stubs take any BaseTransport here; uvicorn's protocol, as its own override says, a Transport.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """A connection opened: the clock for its first request starts."""
        super().connection_made(transport)
        self._head = 0  # bytes of the head read so far; -1 once it is whole
        self._tail = b""  # the last bytes of the head so far, where its end may have begun
        # A connection that sends nothing is timed from its start: it would otherwise be held for ever.
        self._arriving: asyncio.TimerHandle | None = self.loop.call_later(self.client_timeout, self._too_slow)

    def data_received(self, data: bytes) -> None:
        """Bytes arrived: the head counted against its bound, the clock started on a request's first byte."""
        if self._arriving is None:  # a request's first byte
            self._arriving = self.loop.call_later(self.client_timeout, self._too_slow)
        if self._head >= 0:
            # Where the head ends: in ``data``, or across the end of the last chunk (not copying ``data``, a body's worth).
            end = (self._tail + data[:3]).find(_HEAD_END)
            end = end - len(self._tail) if end >= 0 else data.find(_HEAD_END)
            self._head += len(data) if end < 0 else end + len(_HEAD_END)
            self._tail = (self._tail + data)[-3:] if len(data) < 3 else data[-3:]
            if self._head > self.max_head:
                return self._refuse(
                    ClientError(
                        f"the request's head (request line and headers) is larger than this proxy accepts ({self.max_head // 1024} KiB, setting max_header_kb)",
                        status=431,
                        code="header_too_large",
                    )
                )
        super().data_received(data)

    def on_headers_complete(self) -> None:
        """The head is whole: no more counting."""
        self._head = -1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """A request arrived whole: the next one starts its own count and clock."""
        self._head, self._tail = 0, b""  # the next request on this connection starts its own count and clock
        self._stop_clock()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection closed: its clock stopped."""
        self._stop_clock()
        super().connection_lost(exc)

    def _stop_clock(self) -> None:
        """Stop the clock of the request arriving."""
        if self._arriving is not None:
            self._arriving.cancel()
            self._arriving = None

    def _too_slow(self) -> None:
        """A request not whole in time: a 408, or the connection closed if nothing was asked or it was answered."""
        self._arriving = None
        if self._head == 0 or self.cycle is not None and self.cycle.response_started:  # nothing asked, or answered already
            self.transport.close()
            return
        self._refuse(
            ClientError(f"the request did not arrive whole within {self.client_timeout:g} s (setting client_timeout)", status=408, code="client_timeout")
        )

    def send_400_response(self, msg: str) -> None:
        """httptools could not parse the request (a control byte in a header, a bad chunk size): told in the envelope too."""
        self._refuse(ClientError(f"the request is not valid HTTP/1.1: {msg}", code="invalid_http"))

    def _refuse(self, error: ClientError) -> None:
        """Answer ``error`` in the envelope and close: the rest of this connection cannot be read."""
        self._stop_clock()
        if self.transport.is_closing():
            return
        body = error.envelope()
        reason = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}.get(error.status, b"Error")
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (error.status, reason, len(body))
        self.transport.write(head + body)
        self.transport.close()
