"""A client that sends too much head or too slowly is answered in the envelope and let go: a 431 or a 408, never a held connection."""

from __future__ import annotations

import json
import select
import socket
import time

import pytest

from proxy.testing.upstream import completion
from tests.proxy.helpers import eventually

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture
def limited(start_proxy, upstream):
    upstream.default = lambda _: completion("fine")
    return start_proxy(sockets=True, client_timeout=0.6, max_header_kb=16)


def connect(proxy) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def request(body: bytes = BODY, extra: bytes = b"", length: int | None = None) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\n"
        + extra
        + b"content-length: %d\r\n\r\n" % (len(body) if length is None else length)
        + body
    )


def answer(sock: socket.socket) -> tuple[int, bytes, bytes]:
    """The status, head and body of one response on ``sock`` (read until its content-length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        received = sock.recv(65536)
        if not received:
            break
        data += received
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        received = sock.recv(65536)
        if not received:
            break
        body += received
    return int(head.split(b" ")[1]), head, body


def test_a_head_larger_than_max_header_kb_is_a_431_and_goes_nowhere(limited, upstream):
    with connect(limited) as sock:
        try:
            sock.sendall(request(extra=b"x-big: " + b"a" * (8 * 2**20) + b"\r\n"))
        except OSError:  # the proxy answered and closed while the head was still going out
            pass
        status, _, body = answer(sock)
    assert status == 431 and json.loads(body)["error"]["code"] == "header_too_large"
    assert not upstream.requests


def test_a_body_that_stops_arriving_is_a_408_within_client_timeout(limited, upstream):
    with connect(limited) as sock:
        started = time.monotonic()
        sock.sendall(request(body=b'{"model": "', length=1000))
        status, head, body = answer(sock)
        assert time.monotonic() - started < 3
        assert sock.recv(1) == b""  # and the connection is closed
    assert status == 408 and json.loads(body)["error"]["code"] == "client_timeout"
    assert b"connection: close" in head.lower()
    assert not upstream.requests


def answered(sock: socket.socket) -> bool:
    """Whether the proxy has said something on ``sock`` (or closed it)."""
    return bool(select.select([sock], [], [], 0)[0])


def test_a_head_that_trickles_in_is_a_408(limited):
    def trickled() -> bool:
        """One more header line, unless the proxy has answered."""
        if answered(sock):
            return True
        try:
            sock.sendall(b"x-slow-%d: 1\r\n" % int(time.monotonic() * 1000))
        except OSError:  # closed: its answer is there to read
            return True
        return False

    with connect(limited) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n")
        started = time.monotonic()
        eventually(trickled, timeout=3, interval=0.1, awaiting="the proxy to answer a head that has trickled in for client_timeout")
        status, _, body = answer(sock)
    assert status == 408 and time.monotonic() - started < 3


def test_a_connection_that_sends_nothing_is_closed_after_client_timeout(limited):
    with connect(limited) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""
        assert time.monotonic() - started < 3


def test_a_large_body_sent_in_time_and_a_kept_alive_connection_are_served(limited):
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "word " * 400_000}]}).encode()  # 2 MB, far over the head limit
    with connect(limited) as sock:
        for body in (big, BODY):
            sock.sendall(request(body))
            status, _, _ = answer(sock)
            assert status == 200
        idle = time.monotonic() + limited.settings.client_timeout + 0.4  # idle between requests is not a slow request
        eventually(lambda: time.monotonic() >= idle, awaiting="the connection to have idled past client_timeout")
        assert not answered(sock)  # no 408, and not closed
        sock.sendall(request(BODY))
        assert answer(sock)[0] == 200
