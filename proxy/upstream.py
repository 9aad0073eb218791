"""The one pooled HTTP client to the upstream model, and what its failures mean to a client."""

from __future__ import annotations

import logging
import math
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx

from . import headers as pcp
from .errors import PcpError, UpstreamError
from .sse import StreamReader, StreamRules, event_end, is_event_stream

__all__ = ["HOP_BY_HOP", "Check", "Failure", "Upstream", "as_upstream_error", "forwardable", "loopback", "network", "outgoing", "passed_back", "shown_url"]

log = logging.getLogger("pcp.upstream")

# Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus
# the ones each side computes for itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "date",
        "server",
    }
)


Check = Callable[[bytes], dict[str, Any]]  # an API's answer decoded and checked (``apis.codec.checked``)
Failure = Callable[[PcpError], bytes]  # how a relayed stream tells a failure midway (the API's error event)


def forwardable(headers: Mapping[str, str] | httpx.Headers) -> dict[str, str]:
    """The headers that describe the message, not one connection (``HOP_BY_HOP``)."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def outgoing(headers: Mapping[str, str]) -> Mapping[str, str]:
    """What goes upstream of a request's headers: not the client's ``x-pcp-*``, which speak to this proxy;
    ``x-pcp-role``, the proxy's own word to its upstream on the calls it makes, stays."""
    if not any(k[:6].lower() == pcp.PREFIX for k in headers):
        return headers
    return {k: v for k, v in headers.items() if not k.lower().startswith(pcp.PREFIX) or k.lower() == pcp.ROLE}


# What an answer the proxy rewrites (protocol mode) cannot keep of the upstream's: it has a body of its own.
_REWRITTEN = HOP_BY_HOP | {"content-type", "content-encoding", "etag", "content-md5", "digest"}


def passed_back(headers: httpx.Headers) -> dict[str, str]:
    """The upstream's headers for a client that gets the proxy's rewrite of its answer: the request id,
    rate limits, processing time; not those that describe the body, nor the proxy's own ``x-pcp-*``."""
    return {k: v for k, v in headers.items() if k.lower() not in _REWRITTEN and not k.lower().startswith(pcp.PREFIX)}


# Many concurrent long generations are normal for a proxy.
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=64)


def loopback() -> httpx.AsyncBaseTransport:
    """httpx's own transport, as the upstream's client would make it: for a server on this machine (no proxy from the environment)."""
    return httpx.AsyncHTTPTransport(limits=LIMITS)


def network() -> httpx.AsyncBaseTransport:
    """httpx's own transports, as a client without one of its own picks them for each URL: the proxy the environment
    names, or none. Without one named (the common case) the connection pool itself, with no second client to pass."""
    if any(urllib.request.getproxies()):
        return _Network(httpx.AsyncClient(limits=LIMITS))
    return httpx.AsyncHTTPTransport(limits=LIMITS)


class _Network(httpx.AsyncBaseTransport):
    """A transport that sends by a plain client: its pick of transport for each URL (``network``)."""

    def __init__(self, client: httpx.AsyncClient):
        self.client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The request sent as it is, its answer's body not yet read."""
        return await self.client.send(request, stream=True)

    async def aclose(self) -> None:
        """Close the client and its connections."""
        await self.client.aclose()


def shown_url(base_url: str) -> str:
    """How the upstream at ``base_url`` is named to clients (errors, /healthz) and in the log: without credentials nor query."""
    return str(httpx.URL(base_url).copy_with(username=None, password=None, query=None, fragment=None)).rstrip("/")


class Upstream:
    """``transport``: how requests reach the upstream (httpx's own by default; the composition root puts the
    translation of the other APIs to chat in front of it, ``apis.translation``, and tests plug one in).

    ``total_timeout``: seconds an upstream call may take from its request to the
    last byte of its answer, however steadily the bytes trickle in (the read
    timeout bounds only the silence between two of them).
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        total_timeout: float = math.inf,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        url = httpx.URL(base_url)
        # Credentials in the URL become the client's auth and its query the params of every
        # call, so that neither is in the URL httpx logs, and the query stays after the path
        # (".../v1?api-version=1" + "/chat/completions" would put it inside the path).
        self.base_url = shown_url(base_url)
        # How the upstream is named to clients (errors, /healthz) and in the log.
        self.shown_url = self.base_url
        self.read_timeout, self.connect_timeout, self.total_timeout = read_timeout, connect_timeout, total_timeout
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            auth=httpx.BasicAuth(url.username, url.password) if url.userinfo else None,
            params=url.params,
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            limits=LIMITS,
            # The proxy relays bytes as they came; it never decodes what it forwards.
            headers={"accept-encoding": "identity"},
            transport=transport,
        )
        logging.getLogger("httpx").addFilter(REDACTED_URLS)

    async def open(
        self, method: str, path: str, *, content: bytes | None, headers: Mapping[str, str], timeout: float | None = None, deadline: float | None = None
    ) -> httpx.Response:
        """Send a request and return the response with its body not yet read.

        A connection the upstream closed or reset without a word (typically a
        pooled one its keep-alive timeout had just ended) is tried once more.
        ``timeout`` (seconds) overrides the configured connect and read timeouts;
        ``deadline`` (``time.monotonic()``) is the request's, when it has one:
        the call's own total timeout counts from now.
        """
        deadline = min(deadline or math.inf, time.monotonic() + self.total_timeout)
        return await self._send(method, path, content, outgoing(headers), timeout, deadline)

    async def _send(self, method: str, path: str, content: bytes | None, headers: Mapping[str, str], timeout: float | None, deadline: float) -> httpx.Response:
        """One call sent, tried once more where the upstream closed the connection before any answer."""
        for attempt in range(2):
            request = self.client.build_request(method, path, content=content, headers=headers, timeout=self._timeout(timeout, deadline))
            try:
                response = await self.client.send(request, stream=True)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:  # before any response
                if attempt:
                    raise as_upstream_error(exc, self.shown_url) from None
            except httpx.HTTPError as exc:
                raise as_upstream_error(exc, self.shown_url) from None
            else:
                response.extensions[_DEADLINE] = deadline
                return response
        raise AssertionError("unreachable")

    def _timeout(self, timeout: float | None, deadline: float) -> Any:
        """The call's connect and read timeouts, none of them past ``deadline``."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._late()
        if timeout is None and left >= self.read_timeout:
            return httpx.USE_CLIENT_DEFAULT
        return httpx.Timeout(min(timeout or self.read_timeout, left), connect=min(self.connect_timeout, left))

    def _late(self) -> UpstreamError:
        """The 504 for a call that did not finish its answer by its deadline."""
        return UpstreamError(
            f"the upstream at {self.shown_url} did not finish its answer in time (upstream_total_timeout, request_timeout)",
            status=504,
            type="upstream_timeout",
            code="upstream_timeout",
        )

    async def complete(
        self, path: str, content: bytes, headers: Mapping[str, str], check: Check, *, timeout: float | None = None, deadline: float | None = None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """POST a non-streamed call of the API at ``path`` and decode its answer with the API's ``check``,
        with the headers to pass back (``passed_back``); an error status raises as the upstream sent it."""
        response = await self.open("POST", path, content=content, headers=headers, timeout=timeout, deadline=deadline)
        body = await self.read(response)
        if response.status_code >= 400:
            raise UpstreamError.refused(response.status_code, body, response.headers.get("content-type"), response.headers.get("retry-after"))
        return check(body), passed_back(response.headers)

    async def _chunks(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The raw body as it arrives, until the call's deadline; a failure on the way is an UpstreamError."""
        deadline = response.extensions.get(_DEADLINE, math.inf)
        try:
            async for chunk in response.aiter_raw():
                if time.monotonic() > deadline:  # the read timeout bounds the wait for a chunk
                    raise self._late()
                yield chunk
        except httpx.HTTPError as exc:
            raise as_upstream_error(exc, self.shown_url, midway=True) from None

    async def read(self, response: httpx.Response) -> bytes:
        """The whole body, until the call's deadline; the response closed after it."""
        try:
            return b"".join([chunk async for chunk in self._chunks(response)])
        finally:
            await response.aclose()

    async def relay(self, response: httpx.Response, failure: Failure) -> AsyncIterator[bytes]:
        """Yield the raw body as it arrives; closing the iterator closes the upstream stream.

        An event stream is relayed a whole event at a time, so that if the
        upstream fails midway the client's stream ends in an error event, not
        in half an event. A failure before the first chunk raises (``started``
        turns it into a status); in another body, after it, it raises too and
        the connection is cut: a body that stops short of its end is the one
        sign of a failure such a client can read.
        """
        sse = is_event_stream(response.headers.get("content-type"))
        held, sent = b"", False
        try:
            async for chunk in self._chunks(response):
                if sse:
                    held += chunk
                    end = event_end(held)
                    if not end:
                        continue
                    chunk, held = held[:end], held[end:]
                sent = True
                yield chunk
            if held:
                yield held
        except UpstreamError as error:
            if not (sse and sent):
                raise
            log.warning("an upstream stream failed midway; the client gets an error event: %s", error)
            yield failure(error)
        finally:
            await response.aclose()

    async def started(self, response: httpx.Response, failure: Failure) -> AsyncIterator[bytes]:
        """``relay(response)`` once its first chunk is in: a failure before it raises here, while the client can still get a status."""
        chunks = self.relay(response, failure)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            return _relayed(b"", chunks)
        return _relayed(first, chunks)

    async def sse_events(self, response: httpx.Response, rules: StreamRules) -> AsyncIterator[dict[str, Any]]:
        """Decode an event stream into its JSON events, checked whole by the API's ``rules``; closes the response at the end."""
        try:
            content_type = response.headers.get("content-type")
            if content_type and not is_event_stream(content_type):  # a server that ignores ``stream``: its answer as its events
                for event in rules.whole(await self.read(response)):
                    rules.failure(event)
                    yield event
                return
            reader = StreamReader(rules, self.shown_url)
            async for chunk in reader.chunks(self._chunks(response)):
                yield chunk
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        """Close the client, its transport and their connections."""
        await self.client.aclose()


async def _relayed(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``first``, then the rest of the stream."""
    if first:
        yield first
    async for chunk in rest:
        yield chunk


_DEADLINE = "pcp.deadline"  # in a response's extensions: the monotonic time its call must end by


class _RedactedUrls(logging.Filter):
    """httpx logs every call's URL at INFO: shown without credentials, and a query's values hidden."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Show the record's URLs redacted; every record is kept."""
        if isinstance(record.args, tuple) and any(isinstance(arg, httpx.URL) for arg in record.args):
            record.args = tuple(_redacted(arg) if isinstance(arg, httpx.URL) else arg for arg in record.args)
        return True


def _redacted(url: httpx.URL) -> str:
    """A URL as the log shows it: without credentials, its query's values hidden."""
    query = "&".join(f"{key}=…" for key in url.params)
    return str(url.copy_with(username=None, password=None, query=None)) + (f"?{query}" if query else "")


REDACTED_URLS = _RedactedUrls()


def as_upstream_error(exc: httpx.HTTPError, base_url: str, midway: bool = False) -> UpstreamError:
    """What an HTTP failure means to a client: a timeout, an answer broken off (``midway``), or an upstream out of reach."""
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamError(
            f"the upstream at {base_url} did not answer in time ({type(exc).__name__})", status=504, type="upstream_timeout", code="upstream_timeout"
        )
    if midway:
        return UpstreamError(f"the upstream at {base_url} broke off its answer: {str(exc) or type(exc).__name__}", code="upstream_cut")
    return UpstreamError(f"the upstream at {base_url} could not be reached: {str(exc) or type(exc).__name__}", code="upstream_unreachable")
