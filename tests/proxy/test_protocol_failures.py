"""An upstream that refuses a protocol-mode request: the client gets its status with the proxy's headers, and the
proxy keeps nothing of it (no session, no trace, not counted as a served request)."""

from __future__ import annotations

import pytest

from proxy.testing.upstream import Reply, metric_value

from .test_protocol import BUDGET, long_history

REFUSED = Reply(status=404, body=b'{"error": {"message": "model not found", "type": "invalid_request_error"}}')


@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_protocol_request_keeps_the_headers_and_nothing_else(start_proxy, upstream, stream):
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET)
    upstream.default = REFUSED

    reply = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history(), "stream": stream})

    assert reply.status_code == 404 and "model not found" in reply.text
    assert reply.headers["x-pcp-mode"] == "protocol" and int(reply.headers["x-pcp-prompt-tokens"]) > 500
    metrics = proxy.http.get("/metrics").text
    assert metric_value(metrics, "pcp_requests_total", mode="protocol") == 0
    assert metric_value(metrics, "pcp_requests_failed_total", mode="protocol", status="404") == 1
    assert proxy.http.get("/v1/pcp/sessions").json()["data"] == []


def test_the_same_request_answered_is_counted_and_kept(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET)
    reply = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()})
    assert reply.status_code == 200 and reply.headers["x-pcp-mode"] == "protocol"
    assert metric_value(proxy.http.get("/metrics").text, "pcp_requests_total", mode="protocol") == 1
    assert len(proxy.http.get("/v1/pcp/sessions").json()["data"]) == 1


def test_a_busy_upstreams_retry_after_reaches_the_client_in_protocol_mode(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET)
    upstream.default = Reply(status=503, body=b'{"error": {"message": "busy"}}', headers={"content-type": "application/json", "retry-after": "5"})
    reply = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()})
    assert reply.status_code == 503 and reply.headers["retry-after"] == "5" and reply.headers["x-pcp-mode"] == "protocol"


def test_the_inspector_page_names_its_charset_once(proxy):
    for path in ("/inspect", "/inspect/inspect.js", "/inspect/inspect.css"):
        assert proxy.http.get(path).headers["content-type"].count("charset") == 1, path
