"""The inspector's page and data (served by the proxy, per caller), and `pcp-proxy sessions list|show`."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from pcp_core.billing import cached
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


def _conversation(proxy, upstream, headers=KEY) -> list:
    """Three questions as one conversation goes on; the last Consults once (two upstream calls)."""
    upstream.enqueue(completion("Lisbon, in May."), completion("The espresso grinder."), consult_first_summary, completion("5521"))
    asked = [(160, "Which trip did we plan?"), (260, "What did I buy for the kitchen?"), (360, "What is my gym locker code?")]
    responses = [proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": dated_chat(turns, q)}, headers=headers) for turns, q in asked]
    assert all(r.headers["x-pcp-mode"] == "protocol" for r in responses), responses[-1].text
    return responses


def _metric(text: str, name: str, **labels: str) -> float:
    """One series' value in a /metrics exposition (0 where the series is not there)."""
    rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    wanted = f"{name}{{{rendered}}}" if rendered else name
    return next((float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == wanted), 0.0)


def test_each_request_shows_its_bill_beside_untouched_and_the_session_its_totals(start_proxy, upstream):
    proxy = start_proxy(api_keys=["k1"], sentry_threshold=500, context_budget=3072)
    responses = _conversation(proxy, upstream)
    shown = proxy.http.get(f"/v1/pcp/sessions/{responses[-1].headers['x-pcp-session']}", headers=KEY).json()
    requests = shown["requests"]
    assert [r["id"] for r in requests] == [r.headers["x-pcp-trace"] for r in responses]
    price = proxy.settings.cached_input_price
    for trace, response in zip(requests, responses):
        assert not trace["cache_reported"]  # the stand-in upstream reports no cache: the proxy's reading prices the rounds
        # Through the proxy: each round's prefix shared with the call before it, as a provider caches it.
        read = [min(cached(r["shared"]), r["tokens"]) for r in trace["rounds"]]
        assert trace["cached"] == sum(read) and trace["uncached"] == sum(r["tokens"] for r in trace["rounds"]) - sum(read)
        assert trace["billed"] == pytest.approx(sum(r["tokens"] - c + price * c for r, c in zip(trace["rounds"], read)))
        # Untouched: the whole history in one call, of which what the cache could serve.
        assert trace["untouched_cached"] + trace["untouched_uncached"] == trace["prompt_tokens"]
        assert trace["untouched"] == pytest.approx(trace["untouched_uncached"] + price * trace["untouched_cached"])
        assert trace["untouched_fits"] and int(response.headers["x-pcp-tokens-saved"]) == trace["tokens_saved"] == round(trace["untouched"] - trace["billed"])
    # All but the latest exchange was sent before (a first paged request's history, forwarded below the threshold).
    assert all(1024 <= r["untouched_cached"] < r["prompt_tokens"] for r in requests)
    assert requests[-1]["cached"] > 0  # the Consult's round carries the round before it as its prefix
    assert [len(r["rounds"]) for r in requests] == [1, 1, 2]

    bill = shown["bill"]
    assert bill["not_comparable"] == 0 and bill["paged"] == bill["compared"]
    assert bill["paged"] == {
        "requests": 3,
        "rounds": 4,
        "cached": sum(r["cached"] for r in requests),
        "uncached": sum(r["uncached"] for r in requests),
        "billed": pytest.approx(sum(r["billed"] for r in requests)),
    }
    assert bill["untouched"] == {
        "requests": 3,
        "rounds": 3,
        "cached": sum(r["untouched_cached"] for r in requests),
        "uncached": sum(r["untouched_uncached"] for r in requests),
        "billed": pytest.approx(sum(r["untouched"] for r in requests)),
    }
    assert bill["saved"] == sum(int(r.headers["x-pcp-tokens-saved"]) for r in responses)

    # /metrics carries the same sums.
    metrics = proxy.http.get("/metrics", headers=KEY).text
    for request, part, value in (
        ("paged", "cached", bill["paged"]["cached"]),
        ("paged", "uncached", bill["paged"]["uncached"]),
        ("untouched", "cached", bill["untouched"]["cached"]),
        ("untouched", "uncached", bill["untouched"]["uncached"]),
    ):
        assert _metric(metrics, "pcp_input_tokens_total", request=request, cache=part) == value, (request, part)
    assert _metric(metrics, "pcp_billed_input_tokens_total", request="paged") == sum(round(r["billed"]) for r in requests)
    assert _metric(metrics, "pcp_billed_input_tokens_total", request="untouched") == sum(round(r["untouched"]) for r in requests)
    assert _metric(metrics, "pcp_rounds_per_request_sum") == 4 and _metric(metrics, "pcp_rounds_per_request_count") == 3
    assert _metric(metrics, "pcp_tokens_saved_per_request_sum") == bill["saved"]
    assert _metric(metrics, "pcp_requests_not_comparable_total") == 0


def test_a_request_larger_than_the_window_is_billed_and_not_compared(start_proxy, upstream):
    proxy = start_proxy(api_keys=["k1"], sentry_threshold=500, context_budget=1024, context_window=4000)
    responses = _conversation(proxy, upstream)
    shown = proxy.http.get(f"/v1/pcp/sessions/{responses[-1].headers['x-pcp-session']}", headers=KEY).json()
    requests = shown["requests"]
    fits = [r["prompt_tokens"] <= 4000 for r in requests]
    assert fits == [r["untouched_fits"] for r in requests] and fits == [True, False, False]
    assert all(("x-pcp-tokens-saved" in response.headers) == fit for response, fit in zip(responses, fits))
    comparable = [r for r in requests if r["untouched_fits"]]
    bill = shown["bill"]
    assert bill["not_comparable"] == fits.count(False) and bill["compared"]["requests"] == bill["untouched"]["requests"] == len(comparable)
    assert bill["paged"]["billed"] == pytest.approx(sum(r["billed"] for r in requests))
    assert bill["compared"]["billed"] == pytest.approx(sum(r["billed"] for r in comparable))
    assert bill["untouched"]["billed"] == pytest.approx(sum(r["untouched"] for r in comparable))
    assert bill["saved"] == sum(r["tokens_saved"] for r in comparable)

    metrics = proxy.http.get("/metrics", headers=KEY).text
    assert _metric(metrics, "pcp_requests_not_comparable_total") == fits.count(False)
    assert _metric(metrics, "pcp_input_tokens_total", request="untouched", cache="uncached") == sum(r["untouched_uncached"] for r in comparable)
    assert _metric(metrics, "pcp_input_tokens_total", request="paged", cache="uncached") == sum(r["uncached"] for r in requests)
    assert _metric(metrics, "pcp_tokens_saved_per_request_count") == len(comparable)


def test_the_memory_listing_shows_the_callers_scopes_with_their_counts(start_proxy, upstream):
    _scopes_listed(start_proxy(api_keys=["k1", "k2"]))


def test_the_memory_listing_of_a_shared_store_shows_the_same(start_proxy, upstream, redis_server, tmp_path):
    _scopes_listed(start_proxy(api_keys=["k1", "k2"], store=redis_server.url, data_dir=str(tmp_path / "a")))


def _scopes_listed(proxy):
    """Two scopes of one key and one of another's, written through chat requests, as the listing shows them."""
    told = [
        {"role": "user", "content": "My sister Beatrix moved to Lisbon in March."},
        {"role": "assistant", "content": "Lovely."},
        {"role": "user", "content": "Also my bicycle is a green Gazelle."},
    ]
    for key, scope in (("k1", "alice"), ("k1", "bob"), ("k2", "carol")):
        response = proxy.http.post(
            "/v1/chat/completions", json={"model": "m", "messages": told}, headers={"authorization": f"Bearer {key}", "x-pcp-memory": scope}
        )
        assert response.status_code == 200 and response.headers["x-pcp-memory"] == scope
    proxy.services.memory.wait()
    assert proxy.http.get("/v1/pcp/memory").status_code == 401
    listed = proxy.http.get("/v1/pcp/memory", headers=KEY).json()
    assert [s["scope"] for s in listed["data"]] == ["alice", "bob"] and not listed["truncated"]
    for scope in listed["data"]:  # each as the scope's own status says it
        assert scope == proxy.http.get(f"/v1/pcp/memory/{scope['scope']}", headers=KEY).json()
        assert scope["pages"] >= 1 and scope["conversations"] == 1
    assert [s["scope"] for s in proxy.http.get("/v1/pcp/memory", headers={"authorization": "Bearer k2"}).json()["data"]] == ["carol"]
    assert proxy.http.delete("/v1/pcp/memory/bob", headers=KEY).status_code == 200
    assert [s["scope"] for s in proxy.http.get("/v1/pcp/memory", headers=KEY).json()["data"]] == ["alice"]


def test_a_request_whose_upstream_says_what_its_cache_served_is_billed_by_it(start_proxy, upstream):
    proxy = start_proxy(api_keys=["k1"], sentry_threshold=500, context_budget=1024)
    reply = completion("The code is 5521.", prompt_tokens=1800)
    body = json.loads(reply.body)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 1536}
    reply.body = json.dumps(body).encode()
    upstream.enqueue(reply)
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": dated_chat()}, headers=KEY)
    shown = proxy.http.get(f"/v1/pcp/sessions/{response.headers['x-pcp-session']}", headers=KEY).json()
    (trace,) = shown["requests"]
    assert trace["cache_reported"] and (trace["cached"], trace["uncached"]) == (1536, 1800 - 1536)
    assert trace["billed"] == pytest.approx(1800 - 1536 + 0.1 * 1536) and shown["bill"]["paged"]["cached"] == 1536
    metrics = proxy.http.get("/metrics", headers=KEY).text
    assert _metric(metrics, "pcp_input_tokens_total", request="paged", cache="cached") == 1536
    assert _metric(metrics, "pcp_input_tokens_total", request="paged", cache="uncached") == 264
