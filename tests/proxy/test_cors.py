"""Web pages of other origins calling the proxy from a browser (PCP_CORS_ORIGINS): off by default, the proxy's policy only."""

from __future__ import annotations

import http.server
import threading

import pytest

from proxy.settings import SettingsError, load_settings
from proxy.testing.upstream import completion
from tests.proxy.helpers import CHROMIUM, CHROMIUM_FLAGS, long_history

APP = "https://app.example"
BODY = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}]}
PREFLIGHT = {"origin": APP, "access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type, x-pcp-session"}
WIDE_OPEN = {"access-control-allow-origin": "*", "access-control-expose-headers": "x-secret", "content-type": "application/json"}


def test_off_by_default_no_page_of_another_origin_is_let_in(start_proxy, upstream):
    proxy = start_proxy()
    preflight = proxy.http.options("/v1/chat/completions", headers=PREFLIGHT)
    assert "access-control-allow-origin" not in preflight.headers
    assert not upstream.requests  # the proxy's own answer: nothing went upstream


def test_a_preflight_is_answered_before_proxy_keys_and_never_forwarded(start_proxy, upstream):
    proxy = start_proxy(cors_origins=[APP], api_keys=["k-1"])
    preflight = proxy.http.options("/v1/chat/completions", headers=PREFLIGHT)
    assert preflight.status_code in (200, 204)
    assert preflight.headers["access-control-allow-origin"] == APP
    assert {"authorization", "x-pcp-session"} <= {h.strip() for h in preflight.headers["access-control-allow-headers"].split(",")}
    assert not upstream.requests


@pytest.mark.parametrize("paged", [False, True], ids=["passthrough", "protocol"])
def test_the_proxys_policy_replaces_the_upstreams(start_proxy, upstream, paged):
    proxy = start_proxy(cors_origins=[APP], sentry_threshold=300)
    upstream.default = lambda recorded: completion("hi", headers=WIDE_OPEN)
    messages = long_history() if paged else BODY["messages"]
    allowed = proxy.http.post("/v1/chat/completions", json={**BODY, "messages": messages}, headers={"origin": APP})
    assert allowed.status_code == 200 and allowed.headers["x-pcp-mode"] == ("protocol" if paged else "passthrough")
    assert allowed.headers.get_list("access-control-allow-origin") == [APP]
    assert allowed.headers["access-control-expose-headers"] == "*"  # the page may read x-pcp-* and the request id
    other = proxy.http.post("/v1/chat/completions", json={**BODY, "messages": messages}, headers={"origin": "https://evil.example"})
    assert other.status_code == 200 and "access-control-allow-origin" not in other.headers  # the upstream's "*" is not passed on


def test_a_bad_origin_stops_the_start_naming_the_setting():
    with pytest.raises(SettingsError, match="cors_origins"):
        load_settings(environ={"PCP_CORS_ORIGINS": "https://app.example/path"})
    assert load_settings(environ={"PCP_CORS_ORIGINS": "https://a.example, http://127.0.0.1:3000"}).cors_origins == [
        "https://a.example",
        "http://127.0.0.1:3000",
    ]


# -- in a real browser -------------------------------------------------------------------------


@pytest.fixture
def page_origin():
    """A blank page served on a port of its own: an origin other than the proxy's."""

    class Blank(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<!doctype html><title>app</title>")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Blank)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


FETCH = """async ([url, key]) => {
  try {
    const r = await fetch(url + "/v1/chat/completions", {method: "POST", headers: {"authorization": "Bearer " + key, "content-type": "application/json"},
                                                        body: JSON.stringify({model: "m", messages: [{role: "user", content: "Say hi."}]})});
    return {status: r.status, mode: r.headers.get("x-pcp-mode"), text: (await r.json()).choices[0].message.content};
  } catch (e) { return {error: String(e)}; }
}"""


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium; .ci/run installs it as root)")
@pytest.mark.parametrize("allowed", [True, False], ids=["allowed origin", "other origin"])
def test_a_page_of_an_allowed_origin_calls_the_proxy_from_chromium(start_proxy, upstream, page_origin, tmp_path, allowed):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed (pip install -e '.[dev]')")
    proxy = start_proxy(sockets=True, api_keys=["k-web"], cors_origins=[page_origin if allowed else "https://app.example"])
    upstream.default = lambda recorded: completion("hi from upstream", headers=WIDE_OPEN)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.goto(page_origin)
            result = page.evaluate(FETCH, [proxy.url, "k-web"])
        finally:
            browser.close()
    if allowed:
        assert result == {"status": 200, "mode": "passthrough", "text": "hi from upstream"}
    else:
        assert "Failed to fetch" in result["error"]  # the browser refused the answer: the upstream's "*" was not passed on
