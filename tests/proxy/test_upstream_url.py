"""An upstream base URL with credentials and a query: the credentials reach the upstream and no log, the query every call, after the path."""

from __future__ import annotations

import base64
import logging

import pytest
from litestar.testing import TestClient

from proxy.app import create_app
from proxy.settings import Settings
from proxy.testing.upstream import FakeUpstream, completion, stream_reply

BASE = "http://alice:pw-secret@upstream.test/v1?api-key=key-secret&api-version=2024-02-01"
HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} about the river trip {i}"} for i in range(60)]


@pytest.mark.parametrize("threshold", [1_000_000, 200], ids=["passthrough", "protocol"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_credentials_stay_out_of_the_log_and_the_query_follows_the_path(tmp_path, caplog, threshold, stream):
    upstream = FakeUpstream(lambda recorded: stream_reply(["fine, " * 30]) if recorded.json.get("stream") else completion("fine"))
    settings = Settings(upstream_base_url=BASE, data_dir=str(tmp_path), router_embeddings=False, sentry_threshold=threshold, context_budget=700)
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(settings, transport=upstream.transport()), base_url="http://proxy.test") as client:
        response = client.post("/v1/chat/completions", json={"model": "m", "messages": [*HISTORY, {"role": "user", "content": "and?"}], "stream": stream})
        models = client.get("/v1/models")
        health = client.get("/healthz").text
    assert response.status_code == 200 and models.status_code == 200
    for recorded in upstream.requests:
        assert recorded.path in ("/v1/chat/completions", "/v1/models")
        assert recorded.query == "api-key=key-secret&api-version=2024-02-01"
        assert recorded.headers["authorization"] == "Basic " + base64.b64encode(b"alice:pw-secret").decode()
    assert "HTTP Request: POST http://upstream.test/v1/chat/completions?api-key=…&api-version=…" in caplog.text
    for secret in ("pw-secret", "key-secret", "2024-02-01"):
        assert secret not in caplog.text and secret not in health
