"""The inspector's page and data (served by the proxy, per caller), and `pcp-proxy sessions list|show`."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from proxy.cli.sessions import Progress, list_sessions, show_session
from proxy.testing.upstream import completion
from tests.proxy.telemetry_helpers import consult_first_summary, dated_chat

KEY = {"authorization": "Bearer k1"}


def _paged(proxy, upstream, headers=KEY):
    upstream.enqueue(consult_first_summary, completion("5521"))
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": dated_chat()}, headers=headers)
    assert response.headers["x-pcp-mode"] == "protocol", response.text
    return response


def test_the_page_is_served_whole_by_the_proxy_without_a_key(start_proxy):
    proxy = start_proxy(api_keys=["k1"])
    page = proxy.http.get("/inspect")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    for asset in ("/inspect/inspect.js", "/inspect/inspect.css"):
        assert proxy.http.get(asset).status_code == 200
    # Nothing from elsewhere: every script, stylesheet and fetch is the proxy's own.
    text = page.text + proxy.http.get("/inspect/inspect.js").text
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    assert proxy.http.get("/inspect/..%2fapp.py").status_code == 404
    assert proxy.http.get("/inspect/index.htm").status_code == 404


def test_sessions_api_needs_a_key_and_shows_only_its_namespace(start_proxy, upstream):
    proxy = start_proxy(api_keys=["k1", "k2"], sentry_threshold=500, context_budget=1024)
    response = _paged(proxy, upstream)
    assert proxy.http.get("/v1/pcp/sessions").status_code == 401
    listed = proxy.http.get("/v1/pcp/sessions", headers=KEY).json()["data"]
    assert [s["id"] for s in listed] == [response.headers["x-pcp-session"]]
    assert listed[0]["messages"] == 160 and listed[0]["requests"] == 1
    assert proxy.http.get("/v1/pcp/sessions", headers={"authorization": "Bearer k2"}).json()["data"] == []

    shown = proxy.http.get(f"/v1/pcp/sessions/{response.headers['x-pcp-session']}", headers=KEY).json()
    pages = {p["id"]: p for p in shown["pages"]}
    assert shown["roots"] and all(pages[root]["parent"] is None for root in shown["roots"])
    for page in pages.values():  # a tree: each child names its container, a container's size is its pages'
        assert all(pages[kid]["parent"] == page["id"] for kid in page["children"])
        if page["children"]:
            assert page["type"] == "Consolidated" and page["tokens"] == sum(pages[kid]["tokens"] for kid in page["children"])
    assert sum(1 for p in pages.values() if p["type"] == "Original") == shown["originals"]
    assert any("5521" in p["summary"] for p in pages.values() if p["type"] == "Original")
    assert shown["requests"][0]["id"] == response.headers["x-pcp-trace"]


def test_cli_lists_and_shows_sessions_with_a_progress_bar(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=1024)
    # Two callers pin the same session id: one id, two namespaces.
    session = _paged(proxy, upstream, {"authorization": "Bearer sk-one", "x-pcp-session": "chat-1"}).headers["x-pcp-session"]
    assert _paged(proxy, upstream, {"authorization": "Bearer sk-two", "x-pcp-session": "chat-1"}).headers["x-pcp-session"] == session == "chat-1"
    proxy.stop()  # every write on disk

    out, err = io.StringIO(), io.StringIO()
    assert list_sessions(proxy.settings, out=out, err=err, live=True) == 0
    lines = out.getvalue().splitlines()
    assert len([line for line in lines if session in line]) == 2 and "2 session(s)" in lines[-1]
    assert "reading sessions [" in err.getvalue() and "2/2" in err.getvalue()

    out, err = io.StringIO(), io.StringIO()
    assert show_session(proxy.settings, session, out=out, err=err) == 1
    assert "--namespace" in err.getvalue()
    namespace = next(line.split()[0] for line in lines if session in line)
    out = io.StringIO()
    assert show_session(proxy.settings, session, namespace, out=out, err=io.StringIO()) == 0
    shown = out.getvalue()
    assert shown.startswith(f"session {session}") and "160 messages" in shown
    assert "└─ Cons" in shown and "Orig" in shown and "tokens" in shown


@pytest.mark.embedded_store
def test_cli_commands_run_as_a_user_runs_them(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=1024)
    session = _paged(proxy, upstream).headers["x-pcp-session"]
    proxy.stop()
    env = {"PCP_DATA_DIR": str(proxy.settings.data_path), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    listed = subprocess.run([sys.executable, "-m", "proxy", "sessions", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and session in listed.stdout, listed.stderr
    shown = subprocess.run([sys.executable, "-m", "proxy", "sessions", "show", session], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "Consolidated pages" in shown.stdout, shown.stderr
    missing = subprocess.run([sys.executable, "-m", "proxy", "sessions", "show", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no session 'nope'" in missing.stderr


def test_progress_bar_draws_only_on_a_terminal():
    quiet = io.StringIO()
    bar = Progress("walking", 3, quiet)
    for _ in range(3):
        bar.step()
    bar.close()
    assert quiet.getvalue() == ""  # a pipe or a file gets the result, not the bar
    live = io.StringIO()
    bar = Progress("walking", 3, live, live=True)
    for _ in range(3):
        bar.step()
    bar.close()
    assert "[" + "#" * 30 + "] 3/3" in live.getvalue() and live.getvalue().endswith("\n")
