"""The inspector in a real browser: headless Chromium (Debian's) against a real proxy that has paged a conversation.

Driven by Playwright for Python with the system's browser (never a browser
download). ``.ci/run`` installs Chromium when it is missing; these tests skip,
saying why, only where it cannot be had. Set ``PCP_INSPECTOR_SCREENSHOT`` to a
path to keep the screenshot somewhere else as well (the README's is made so).
"""

from __future__ import annotations

import math
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


def _n(x: float) -> str:
    """A number as the page writes it: rounded half up, in thousands."""
    return f"{math.floor(x + 0.5):,}"


def _remembered(proxy, key: str, scope: str) -> dict:
    """A short conversation written into the memory scope ``scope``, and the scope's status once it is stored."""
    told = [
        {"role": "user", "content": "My bicycle is a green Gazelle from 1987."},
        {"role": "assistant", "content": "A classic."},
        {"role": "user", "content": "And my sister teaches cello."},
    ]
    auth = {"authorization": f"Bearer {key}"}
    response = proxy.http.post("/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": told}, headers={**auth, "x-pcp-memory": scope})
    assert response.headers["x-pcp-memory"] == scope, response.text
    proxy.services.memory.wait()
    return proxy.http.get(f"/v1/pcp/memory/{scope}", headers=auth).json()


def _expect_bill(page, requests: list[dict]) -> None:
    """Each request's row shows its bill and its untouched one (cached / uncached beneath), and the saving, as its trace has them."""
    for r in requests:
        row = page.locator(f'#request-table tr[data-trace="{r["id"]}"]')
        sync_api.expect(row.locator("td.rounds")).to_have_text(str(len(r["rounds"])))
        sync_api.expect(row.locator("td.billed .total")).to_have_text(_n(r["billed"]))
        sync_api.expect(row.locator("td.billed .split")).to_have_text(f"{r['cached']:,} / {r['uncached']:,}")
        if r["untouched_fits"]:
            sync_api.expect(row.locator("td.untouched .total")).to_have_text(_n(r["untouched"]))
            sync_api.expect(row.locator("td.untouched .split")).to_have_text(f"{r['untouched_cached']:,} / {r['untouched_uncached']:,}")
            sync_api.expect(row.locator("td.saved")).to_have_text(f"{r['tokens_saved']:,} ({_n(100 * r['tokens_saved'] / r['untouched'])}%)")
        else:
            sync_api.expect(row.locator("td.untouched")).to_have_text("not comparable")
            sync_api.expect(row.locator("td.saved")).to_have_text("not comparable")


def _expect_totals(page, row_id: str, requests: list[dict], untouched: bool = False) -> None:
    """A row of the session's bill: the sums over ``requests``, each computed here from their traces."""
    row = page.locator(f"#{row_id}")
    prefix = "untouched_" if untouched else ""
    sync_api.expect(row.locator("td.requests")).to_have_text(str(len(requests)))
    sync_api.expect(row.locator("td.rounds")).to_have_text(str(len(requests) if untouched else sum(len(r["rounds"]) for r in requests)))
    sync_api.expect(row.locator("td.cached")).to_have_text(f"{sum(r[prefix + 'cached'] for r in requests):,}")
    sync_api.expect(row.locator("td.uncached")).to_have_text(f"{sum(r[prefix + 'uncached'] for r in requests):,}")
    sync_api.expect(row.locator("td.billed")).to_have_text(_n(sum(r["untouched" if untouched else "billed"] for r in requests)))


def test_inspector_shows_a_real_session(start_proxy, upstream, browser, tmp_path):
    proxy = start_proxy(sockets=True, api_keys=["k-inspect", "k-other"], sentry_threshold=500, context_budget=1024)
    *earlier, last = _served_conversation(proxy, upstream, "k-inspect")
    session = last["x-pcp-session"]
    assert last["x-pcp-mode"] == "protocol" and all(h["x-pcp-session"] == session for h in earlier)
    data = proxy.http.get(f"/v1/pcp/sessions/{session}", headers={"authorization": "Bearer k-inspect"}).json()
    scope = _remembered(proxy, "k-inspect", "home")
    _remembered(proxy, "k-other", "elsewhere")  # another key's scope: never on this key's page

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

    # Each request's bill beside the same request's sent untouched, and the session's totals, as the traces sum them.
    requests = data["requests"]
    _expect_bill(page, requests)
    assert all(r["untouched_fits"] for r in requests)
    sync_api.expect(page.locator("#bill-compared")).to_have_count(0)
    _expect_totals(page, "bill-paged", requests)
    _expect_totals(page, "bill-untouched", requests, untouched=True)
    saved = sum(int(h["x-pcp-tokens-saved"]) for h in [*earlier, last])
    sync_api.expect(page.locator("#saved-total")).to_have_text(f"{saved:,}")
    ratio = sum(r["billed"] for r in requests) / sum(r["untouched"] for r in requests)
    sync_api.expect(page.locator("#bill-ratio")).to_have_text(f"{ratio:.2f}×")

    # The key's memory scope, with its counts as the memory API says them; no other key's.
    memory = page.locator("#memory-table tbody tr")
    sync_api.expect(memory).to_have_count(1)
    home = page.locator('#memory-table tr[data-scope="home"]')
    for cell, value in (("pages", scope["pages"]), ("originals", scope["originals"]), ("conversations", scope["conversations"]), ("pending", 0)):
        sync_api.expect(home.locator(f"td.{cell}")).to_have_text(f"{value:,}")
    assert scope["pages"] >= 1
    sync_api.expect(page.locator("#memory")).not_to_contain_text("not built")

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
    assert page.locator("#memory-table tbody tr").count() == 0


def test_inspector_shows_a_request_larger_than_the_window_as_not_comparable(start_proxy, upstream, browser):
    proxy = start_proxy(sockets=True, api_keys=["k-window"], sentry_threshold=500, context_budget=1024, context_window=4000)
    headers = _served_conversation(proxy, upstream, "k-window")
    session = headers[-1]["x-pcp-session"]
    requests = proxy.http.get(f"/v1/pcp/sessions/{session}", headers={"authorization": "Bearer k-window"}).json()["requests"]
    comparable = [r for r in requests if r["untouched_fits"]]
    assert comparable and len(comparable) < len(requests)  # the first fits the window, the later ones do not
    assert [("x-pcp-tokens-saved" in h) for h in headers] == [r["untouched_fits"] for r in requests]

    page = browser.new_page()
    page.goto(f"{proxy.url}/inspect")
    page.fill("#key", "k-window")
    page.click("#key-form button")
    page.locator(f'#session-table tr[data-session="{session}"]').click()
    sync_api.expect(page.locator("#request-table tbody tr")).to_have_count(len(requests))
    _expect_bill(page, requests)
    sync_api.expect(page.locator("#request-table td.saved.not-comparable")).to_have_count(len(requests) - len(comparable))
    # The totals: every request billed; the comparison only over those that could have gone untouched.
    _expect_totals(page, "bill-paged", requests)
    _expect_totals(page, "bill-compared", comparable)
    _expect_totals(page, "bill-untouched", comparable, untouched=True)
    sync_api.expect(page.locator("#saved-total")).to_have_text(f"{sum(r['tokens_saved'] for r in comparable):,}")
    sync_api.expect(page.locator("#session-saving")).to_contain_text(f"{len(requests) - len(comparable)} request(s) larger than the model's window")
    # No memory scope for this key.
    sync_api.expect(page.locator("#memory-table tbody")).to_contain_text("No memory scope for this key yet")
