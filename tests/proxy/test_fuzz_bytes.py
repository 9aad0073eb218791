"""Bodies and headers at the byte level: whatever bytes a client sends, it gets an answer or an error in the envelope, never the proxy's 500, never a hang.

``test_robustness.py`` varies the JSON's shape; this varies its bytes: text
that is not UTF-8, nesting thousands deep, numbers past any range, bytes
flipped, cut or added, and header values of any byte but a line break.
Requests go to a real server (uvicorn with the proxy's guard) on loopback, in
front of the fake upstream, in passthrough and protocol mode alike (a long
history engages it). 30 fixed examples each; ``FUZZ_EXAMPLES=1000`` searches
further, with new examples each run.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.app import create_app
from proxy.cli.server import server_options
from proxy.settings import Settings
from proxy.testing.upstream import FakeUpstream, serve_in_thread

SEARCH = os.environ.get("FUZZ_EXAMPLES")
EXAMPLES = settings(max_examples=int(SEARCH or 30), derandomize=SEARCH is None, deadline=None, suppress_health_check=list(HealthCheck))
INTERNAL = b"internal proxy error"
HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} about gardens, budgets and the river trip {i}"} for i in range(40)]


@pytest.fixture(scope="module")
def proxy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with FakeUpstream() as upstream:
        proxy_settings = Settings(
            upstream_base_url=upstream.url,
            data_dir=str(tmp_path_factory.mktemp("data")),
            router_embeddings=False,
            sentry_threshold=200,
            context_budget=700,
            max_rounds=2,
            client_timeout=5,
        )
        server = serve_in_thread(create_app(proxy_settings), **server_options(proxy_settings))
        yield server.url
        server.stop()


def body(long: bool, stream: bool) -> bytes:
    messages = [*(HISTORY if long else []), {"role": "user", "content": "what about the river trip?"}]
    return json.dumps({"model": "m", "messages": messages, "stream": stream, "temperature": 0.5}).encode()


NOT_UTF8 = st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"]) | st.binary(min_size=1, max_size=4).filter(
    lambda b: not _is_utf8(b)
)
HUGE = st.sampled_from([b"1e999", b"-1e999", b"1e-999", b"NaN", b"Infinity", b"-0", b"9" * 5000, b"-" + b"9" * 400, b"0.0000000000000000000000001e400"])


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@st.composite
def hostile_body(draw: st.DrawFn) -> bytes:
    raw = body(draw(st.booleans()), draw(st.booleans()))
    kind = draw(st.sampled_from(["not utf-8", "deep", "huge number", "flip", "cut", "insert", "random"]))
    at = draw(st.integers(0, len(raw)))
    if kind == "not utf-8":  # inside a string, where JSON allows any text but bytes must be UTF-8
        quote = raw.find(b'"content": "') + len(b'"content": "') if draw(st.booleans()) else raw.find(b'"m"') + 1
        return raw[:quote] + draw(NOT_UTF8) + raw[quote:]
    if kind == "deep":
        depth = draw(st.integers(1, 5000))
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        closer = b"]" if opener == b"[" else b"}"
        where = draw(st.sampled_from([b'"temperature": 0.5', b'"content": "what about the river trip?"']))
        key = where.split(b":")[0]
        return raw.replace(where, key + b": " + opener * depth + b"1" + closer * depth)
    if kind == "huge number":
        return raw.replace(b"0.5", draw(HUGE)) if draw(st.booleans()) else raw.replace(b'"m"', draw(HUGE))
    if kind == "flip":
        return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    if kind == "cut":
        return raw[:at]
    if kind == "insert":
        return raw[:at] + draw(st.binary(min_size=1, max_size=16)) + raw[at:]
    return draw(st.binary(max_size=200))


def assert_answered(status: int, content: bytes) -> None:
    assert INTERNAL not in content, content[:300]
    assert status != 500, content[:300]
    if status >= 400:
        error = json.loads(content)["error"]
        assert {"message", "type", "param", "code"} <= set(error)


@EXAMPLES
@given(content=hostile_body())
def test_any_body_bytes_get_an_answer_or_an_error_in_the_envelope(proxy_url, content):
    response = httpx.post(
        f"{proxy_url}/v1/chat/completions", content=content, headers={"content-type": "application/json", "authorization": "Bearer k"}, timeout=30
    )
    assert_answered(response.status_code, response.content)


header_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(lambda name: f"x-{name}".encode())
header_value = st.binary(max_size=300).map(lambda value: value.replace(b"\r", b"").replace(b"\n", b"")) | st.text(max_size=40).map(
    lambda text: text.encode()
).filter(lambda b: b"\r" not in b and b"\n" not in b)
known_header = st.sampled_from([b"authorization", b"x-pcp-session", b"x-pcp-mode-request", b"content-type", b"accept", b"api-key", b"user-agent"])


@EXAMPLES
@given(headers=st.lists(st.tuples(header_name | known_header, header_value), max_size=6), long=st.booleans())
def test_any_header_bytes_get_an_answer_or_an_error_in_the_envelope(proxy_url, headers, long):
    content = body(long, stream=False)
    lines = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nconnection: close\r\n" + lines + b"content-length: %d\r\n\r\n" % len(content)
    status, received = _exchange(proxy_url, head + content)
    assert_answered(status, received)


def _exchange(url: str, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` on a raw socket (httpx would refuse some of these headers) and read the answer to its end."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while received := sock.recv(65536):
            data += received
    head, _, content = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        content = _unchunked(content)
    return int(head.split(b" ")[1]), content


def _unchunked(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + rest[:n], rest[n + 2 :]
    return out
