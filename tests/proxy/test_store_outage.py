"""With the shared store killed, no request answers 200 with a session that is not there once the store is back.

A real redis-server (tests/proxy/redis_server.py) is stopped while each kind
of request that keeps state is sent: a paged conversation, one long message
paged as a File block, a Hybrid-mode request, the components, todo and
memory routes. Each either answers 503 (``store_unavailable``) or keeps
what it answered; once Redis is back every session answered with is found.
The log stays readable: no exception left unretrieved.
"""

from __future__ import annotations

import gc
import json
import logging

import pytest

from proxy.testing.upstream import completion
from tests.proxy.helpers import conversation, eventually

AUTH = {"authorization": "Bearer sk-a"}
SETTINGS = {"sentry_threshold": 500, "context_budget": 1024, "hybrid": "disabled"}


def chat(proxy, messages, **headers):
    return proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers={**AUTH, **headers})


def own(proxy, method, path, body=None):
    content = json.dumps(body).encode() if body is not None else None
    return proxy.http.request(method, path, content=content, headers={**AUTH, "content-type": "application/json"})


LONG_MESSAGE = "\n\n".join(f"## Section {i}\n\n" + " ".join(f"word{i}x{j} of the orchard ledger" for j in range(60)) for i in range(30))
KINDS = {
    "paged conversation": lambda p: chat(p, [*conversation(80), {"role": "user", "content": "And the roof?"}]),
    "a long message paged as a File block": lambda p: chat(p, [{"role": "user", "content": LONG_MESSAGE}]),
    "a long message in a memory scope": lambda p: chat(p, [{"role": "user", "content": LONG_MESSAGE}], **{"x-pcp-memory": "notes"}),
    "a pinned session": lambda p: chat(p, [*conversation(80), {"role": "user", "content": "And the door?"}], **{"x-pcp-session": "pinned-1"}),
    "a Hybrid-mode request": lambda p: chat(p, [{"role": "user", "content": "Hi"}], **{"x-pcp-context-mode": "enabled"}),
    "a paged Hybrid-mode request": lambda p: chat(p, [*conversation(80), {"role": "user", "content": "Next?"}], **{"x-pcp-context-mode": "enabled"}),
    "a component": lambda p: own(p, "POST", "/v1/pcp/sessions/s1/components", {"at": "d-1,1,0", "content": "be brief"}),
    "a todo list": lambda p: own(p, "PUT", "/v1/pcp/sessions/s1/todo", {"items": [{"id": 1, "title": "x"}]}),
    "a memory import": lambda p: own(p, "POST", "/v1/pcp/memory/notes/import", None),
    "a forget": lambda p: own(p, "POST", "/v1/pcp/memory/notes/forget", {"query": "orchard"}),
}


def found_after(proxy, kind: str, answer) -> bool:
    """Whether what ``answer`` said it kept is there now."""
    session = answer.headers.get("x-pcp-session")
    if kind in ("a component", "a todo list"):
        path = "/v1/pcp/sessions/s1/components" if kind == "a component" else "/v1/pcp/sessions/s1/todo"
        data = own(proxy, "GET", path).json()
        return bool(data.get("data") or data.get("items"))
    if session is None:
        return True  # nothing said kept (a forget, an import: the scope is read back by their own tests)
    shown = own(proxy, "GET", f"/v1/pcp/sessions/{session}")
    context = own(proxy, "GET", f"/v1/pcp/sessions/{session}/context")
    return shown.status_code == 200 or context.status_code == 200


@pytest.mark.parametrize("kind", list(KINDS))
def test_with_the_store_killed_no_request_answers_200_with_a_session_that_is_not_kept(kind, start_proxy, upstream, redis_server, caplog):
    upstream.default = lambda recorded: completion("Noted.\n<<<CONTEXT>>>\n{}")
    proxy = start_proxy(store=redis_server.url, **SETTINGS)
    assert chat(proxy, [{"role": "user", "content": "warm up"}]).status_code == 200
    caplog.set_level(logging.WARNING)

    redis_server.stop()
    answer = KINDS[kind](proxy) if kind != "a memory import" else _import(proxy)
    assert answer.status_code in (200, 201, 503), answer.text[:300]
    if answer.status_code == 503:
        assert answer.json()["error"]["code"] == "store_unavailable"

    redis_server.start()  # its append-only file read back
    eventually(
        lambda: own(proxy, "GET", "/v1/pcp/sessions/none/todo").status_code != 503, timeout=20, interval=0.1, awaiting="the proxy to reach the restarted store"
    )
    if answer.status_code < 300:
        assert found_after(proxy, kind, answer), f"{kind}: answered {answer.status_code} with {answer.headers.get('x-pcp-session')}, not kept"
    proxy.stop()
    gc.collect()  # an asyncio future's unretrieved exception is logged when it is collected
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def _import(proxy):
    page = {
        "type": "Original", "id": "p1", "origin": "Storage", "depth": 0, "timestamp": "2026-01-01T00:00:00",
        "keywords": ["orchard"], "summary": "orchard", "content": "the orchard",
    }  # fmt: skip
    return proxy.http.post("/v1/pcp/memory/notes/import", content=json.dumps(page).encode() + b"\n", headers=AUTH)


def test_with_dense_recall_on_an_outage_leaves_no_exception_unretrieved(start_proxy, upstream, redis_server, caplog):
    """The query's vector is encoded while the history is paged; a request that fails first (its store down) never awaits it."""
    pytest.importorskip("sentence_transformers", reason="the bundled encoder is not installed (the `embeddings` extra)")
    upstream.default = lambda recorded: completion("Noted.")
    proxy = start_proxy(store=redis_server.url, **{**SETTINGS, "router_embeddings": True})
    messages = [*conversation(80), {"role": "user", "content": "And the roof?"}]
    assert chat(proxy, messages).status_code == 200
    embedder = proxy.services.embedder
    eventually(lambda: embedder.ready, timeout=120, interval=0.1, awaiting="the model to load in the background")
    caplog.set_level(logging.WARNING)
    redis_server.stop()
    for n in range(3):
        assert chat(proxy, [*conversation(80, start=n * 100), {"role": "user", "content": f"Question {n}?"}]).status_code == 503
    redis_server.start()
    proxy.stop()
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


@pytest.mark.parametrize(
    "url", ["redis://:pw-secret@host:abc/0", "redis://:pw-secret@host:99999", "redis://:pw-secret@[::1", "redis://:pw-secret@host:6379/zero"]
)
def test_a_malformed_store_is_a_settings_error_naming_it_without_its_password(url, tmp_path):
    import subprocess
    import sys

    from proxy.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match=r"setting store \(env PCP_STORE\)") as refused:
        load_settings(environ={"PCP_STORE": url})
    assert "pw-secret" not in str(refused.value)
    env = {"PCP_STORE": url, "PCP_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    started = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:9/v1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert started.returncode != 0 and "setting store" in started.stderr
    assert "Traceback" not in started.stderr and "pw-secret" not in started.stderr
