"""The inspector in a real browser: headless Chromium (Debian's) against a real proxy that has paged a conversation.

Driven by Playwright for Python with the system's browser (never a browser
download). ``.ci/run`` installs Chromium when it is missing; these tests skip,
saying why, only where it cannot be had. Set ``PCP_INSPECTOR_SCREENSHOT`` to a
path to keep the screenshot somewhere else as well (the README's is made so).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from proxy.testing.upstream import completion
from tests.proxy.helpers import CHROMIUM, CHROMIUM_FLAGS
from tests.proxy.telemetry_helpers import consult_first_summary, dated_chat

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed (pip install -e '.[dev]')")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium; .ci/run installs it as root)")


@pytest.fixture
def browser(tmp_path):
    with sync_api.sync_playwright() as playwright:
        # A fresh profile each time, and the system's browser: nothing is downloaded.
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000}
        )
        try:
            yield context
        finally:
            context.close()


def _served_conversation(proxy, upstream, key: str) -> list[dict]:
    """Three questions as the conversation goes on (the history grows, what is sent does not); the last Consults once."""
    client = proxy.client(api_key=key)
    upstream.enqueue(completion("Lisbon, in May."), completion("The espresso grinder."), consult_first_summary, completion("Your locker code is 5521."))
    asked = [(160, "Which trip did we plan?"), (260, "What did I buy for the kitchen?"), (360, "What is my gym locker code?")]
    return [client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=dated_chat(turns, question)).headers for turns, question in asked]


def test_inspector_shows_a_real_session(start_proxy, upstream, browser, tmp_path):
    proxy = start_proxy(sockets=True, api_keys=["k-inspect"], sentry_threshold=500, context_budget=1024)
    *earlier, last = _served_conversation(proxy, upstream, "k-inspect")
    session = last["x-pcp-session"]
    assert last["x-pcp-mode"] == "protocol" and all(h["x-pcp-session"] == session for h in earlier)
    data = proxy.http.get(f"/v1/pcp/sessions/{session}", headers={"authorization": "Bearer k-inspect"}).json()

    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" and "401" not in message.text else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(f"{proxy.url}/inspect")

    # The proxy has keys: the page asks for one before it shows anything.
    sync_api.expect(page.locator("#notice")).to_contain_text("asks for a key")
    assert page.locator("#session-table tbody tr").count() == 0
    page.fill("#key", "k-inspect")
    page.click("#key-form button")
    row = page.locator(f'#session-table tr[data-session="{session}"]')
    sync_api.expect(row.locator("td").nth(1)).to_have_text(str(data["messages"]))
    row.click()

    # The session: its page tree drawn node for node, its three requests, the rounds of the latest.
    sync_api.expect(page.locator("#session-id")).to_have_text(session)
    nodes = page.locator("#tree-plot svg .node")
    sync_api.expect(nodes).to_have_count(len(data["pages"]))
    assert page.locator("#tree-plot svg rect.node").count() == data["consolidated"]
    sync_api.expect(page.locator("#request-table tbody tr")).to_have_count(3)
    assert page.locator("#tokens-plot svg circle.sent").count() == 4  # one round, one, then two
    assert page.locator("#tree-plot svg .node.detail").count() >= 2

    # The latest request, shown first: its Consult in the rounds table and on the tree.
    sync_api.expect(page.locator("#request-table tr.selected")).to_have_attribute("data-trace", last["x-pcp-trace"])
    sync_api.expect(page.locator("#rounds")).to_contain_text(f"Consult({last['x-pcp-consulted']})")
    sync_api.expect(page.locator(f'#tree-plot svg .node.consulted[data-page="{last["x-pcp-consulted"]}"]')).to_have_count(1)

    shot = tmp_path / "inspector.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("PCP_INSPECTOR_SCREENSHOT"):
        shutil.copy(shot, Path(os.environ["PCP_INSPECTOR_SCREENSHOT"]))

    # A page of the tree opens in the list, with its words: the locker code's page is there.
    sync_api.expect(page.locator("#page-list")).to_contain_text("5521")
    nodes.first.click()
    sync_api.expect(page.locator("#page-list li.flash details[open]")).to_have_count(1)
    assert problems == []


def test_inspector_with_a_wrong_key_shows_nothing(start_proxy, upstream, browser):
    proxy = start_proxy(sockets=True, api_keys=["k-right"], sentry_threshold=500, context_budget=1024)
    _served_conversation(proxy, upstream, "k-right")
    page = browser.new_page()
    page.goto(f"{proxy.url}/inspect")
    page.fill("#key", "k-wrong")
    page.click("#key-form button")
    sync_api.expect(page.locator("#notice")).to_contain_text("not one of the proxy's keys")
    assert page.locator("#session-table tbody tr").count() == 0
