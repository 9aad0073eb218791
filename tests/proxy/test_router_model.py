"""PCP_ROUTER_MODEL: a model picks among the best-ranked pages before the worker reads them (§VI.2)."""

from __future__ import annotations

import re

from lxml import etree

from pcp_core.prompt.markup import node_view
from proxy.testing.apis import worker_document
from proxy.testing.upstream import Recorded, Reply, by_role, completion
from tests.proxy.helpers import ask

PLACES = ["Lisbon", "Oslo", "Nairobi", "Quito", "Hanoi"]
HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: the order #{1000 + i} ships to {PLACES[i % 5]} by sea."} for i in range(200)]
QUESTION = {"role": "user", "content": "Which orders ship to Oslo by sea?"}


def candidates(recorded: Recorded) -> list[str]:
    return re.findall(r"^\[(\w+)\] ", recorded.json["messages"][1]["content"], re.MULTILINE)


def picks_the_last_candidate(recorded: Recorded) -> Reply:
    if recorded.headers.get("x-pcp-role") == "router":
        return completion(f"{candidates(recorded)[-1]}", prompt_tokens=300, completion_tokens=5)
    return completion("Orders 1001, 1006 and more.", prompt_tokens=1000, completion_tokens=8)


def detail_ids(recorded: Recorded) -> set[str]:
    document = etree.fromstring(worker_document(recorded).encode())
    return {node.get("id") for node in document.iter("Node") if node_view(node) == "Detail"}


def test_the_router_models_pick_is_shown_to_the_worker(start_proxy, upstream):
    upstream.default = picks_the_last_candidate
    proxy = start_proxy(sentry_threshold=500, context_budget=900, router_model="small-router")
    response = ask(proxy, [*HISTORY, QUESTION], model="big")

    (router,) = upstream.chat_requests("router")
    (worker,) = upstream.chat_requests("worker")
    assert router.json["model"] == "small-router" and router.json["temperature"] == 0
    assert router.headers["authorization"] == "Bearer sk-a"
    assert "Which orders ship to Oslo by sea?" in router.json["messages"][1]["content"]
    assert candidates(router)[-1] in detail_ids(worker)
    # The answering call's usage: the context the answer was read from (the router's call is the proxy's own work).
    assert response.json()["usage"] == {"prompt_tokens": 1000, "completion_tokens": 8, "total_tokens": 1008}
    assert 'pcp_upstream_calls_total{role="router"} 1' in proxy.http.get("/metrics").text


def test_without_a_router_model_the_broad_match_decides(start_proxy, upstream):
    upstream.default = picks_the_last_candidate
    routed = start_proxy(sentry_threshold=500, context_budget=900, router_model="small-router")
    ask(routed, [*HISTORY, QUESTION], model="big")
    pick = candidates(upstream.chat_requests("router")[0])[-1]

    plain = start_proxy(sentry_threshold=500, context_budget=900)
    ask(plain, [*HISTORY, QUESTION], model="big")
    assert len(upstream.chat_requests("router")) == 1  # the second proxy asked no router
    assert pick not in detail_ids(upstream.chat_requests("worker")[-1])


def test_a_failing_router_model_costs_the_client_nothing(start_proxy, upstream):
    overloaded = Reply(status=503, body=b'{"error": {"message": "overloaded"}}')
    upstream.default = by_role({"router": overloaded}, default=completion("Orders 1001 and 1006."))
    proxy = start_proxy(sentry_threshold=500, context_budget=900, router_model="small-router")
    assert ask(proxy, [*HISTORY, QUESTION], model="big").json()["choices"][0]["message"]["content"] == "Orders 1001 and 1006."
    assert len(upstream.chat_requests("router")) == 1 and len(upstream.chat_requests("worker")) == 1
