"""An upstream reached through the HTTP proxy the environment names (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY), as httpx's own
clients reach it; with none named, straight."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from proxy.testing.upstream import completion


class _ForwardProxy(BaseHTTPRequestHandler):
    """A forward proxy that answers every request itself, keeping the absolute URL it was asked for."""

    seen: list[str] = []

    def do_POST(self) -> None:
        """Answer the request, keeping the URL it was asked for."""
        self.rfile.read(int(self.headers.get("content-length") or 0))
        _ForwardProxy.seen.append(self.path)
        body = completion("through the proxy").body
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def forward_proxy():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ForwardProxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _ForwardProxy.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_upstream_is_reached_through_the_proxy_the_environment_names(start_proxy, forward_proxy, monkeypatch):
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", forward_proxy)
    proxy = start_proxy(upstream_base_url="http://upstream.invalid/v1")
    answer = proxy.http.post("/v1/chat/completions", content=json.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}))
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "through the proxy"
    assert _ForwardProxy.seen == ["http://upstream.invalid/v1/chat/completions"]


def test_with_no_proxy_named_the_upstream_is_reached_straight(start_proxy, forward_proxy, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    proxy = start_proxy(upstream_base_url="http://upstream.invalid/v1")
    answer = proxy.http.post("/v1/chat/completions", content=json.dumps({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}))
    assert answer.status_code == 502  # no such host, and nothing between
    assert _ForwardProxy.seen == []
