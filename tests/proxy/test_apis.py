"""One rule book for three APIs: sessions, the router model and the answer gate work the same whichever the client speaks."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from proxy.testing.apis import PATHS, answer, api_of, api_requests
from proxy.testing.upstream import Recorded, Reply, metric_value
from tests.proxy.helpers import BUDGET, long_history

from .api_helpers import document

APIS = list(PATHS)


def body(api: str, messages: list[dict], **more: Any) -> dict[str, Any]:
    """``messages`` (a chat conversation, its system prompt first) as a request of ``api``."""
    system, rest = messages[0]["content"], messages[1:]
    if api == "responses":
        return {"model": "m", "instructions": system, "input": rest, **more}
    if api == "messages":
        return {"model": "m", "max_tokens": 100, "system": system, "messages": rest, **more}
    return {"model": "m", "messages": messages, **more}


def said(api: str, reply: httpx.Response) -> str:
    data = reply.json()
    if api == "responses":
        return "".join(part["text"] for item in data["output"] for part in item["content"])
    if api == "messages":
        return "".join(block["text"] for block in data["content"])
    return data["choices"][0]["message"]["content"]


def ask_in(proxy, api: str, messages: list[dict], **headers: str) -> httpx.Response:
    """One request of ``api`` (chat's ``ask``, in the API's own shape); its 200 checked."""
    reply = proxy.http.post(f"/v1{PATHS[api]}", json=body(api, messages), headers=headers)
    assert reply.status_code == 200, reply.text
    return reply


@pytest.mark.parametrize("api", APIS)
def test_a_follow_up_continues_its_session_and_pages_only_its_new_turns(start_proxy, upstream, api):
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET)
    first = ask_in(proxy, api, long_history())
    follow_up = [*long_history(), {"role": "assistant", "content": said(api, first)}, {"role": "user", "content": "And my bike lock?"}]
    second = ask_in(proxy, api, follow_up)
    assert re.fullmatch(r"s-[0-9a-f]{16}", first.headers["x-pcp-session"])
    assert second.headers["x-pcp-session"] == first.headers["x-pcp-session"]
    metrics = proxy.http.get("/metrics").text
    assert metric_value(metrics, "pcp_sessions_total", how="new") == 1 and metric_value(metrics, "pcp_sessions_total", how="resumed") == 1
    pinned = ask_in(proxy, api, long_history(), **{"x-pcp-session": "pinned-1"})
    assert pinned.headers["x-pcp-session"] == "pinned-1"


@pytest.mark.parametrize("api", APIS)
def test_the_router_model_is_asked_in_the_clients_api_and_the_answer_tells_the_workers_usage(start_proxy, upstream, api):
    def play(recorded: Recorded) -> Reply:
        if recorded.headers.get("x-pcp-role") == "router":
            candidates = re.findall(r"^\[(\w+)\] ", str(recorded.body, "utf-8").replace("\\n", "\n"), re.MULTILINE)
            return answer(api_of(recorded), candidates[-1], input_tokens=300, output_tokens=5)
        return answer(api_of(recorded), "Your locker code is 5521.", input_tokens=1000, output_tokens=8)

    upstream.default = play
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, router_model="small-router")
    reply = ask_in(proxy, api, long_history())
    (router,) = api_requests(upstream, api, "router")
    (worker,) = api_requests(upstream, api, "worker")
    assert router.json["model"] == "small-router" and "What is my gym locker code?" in router.body.decode()
    assert document(worker).findtext("Query") == "What is my gym locker code?"
    assert said(api, reply) == "Your locker code is 5521."
    usage = reply.json()["usage"]
    # The answering call's usage: the context the answer was read from (the router's call is the proxy's own work).
    assert (usage.get("prompt_tokens") or usage.get("input_tokens"), usage.get("completion_tokens") or usage.get("output_tokens")) == (1000, 8)


@pytest.mark.parametrize("api", APIS)
def test_a_worker_that_only_writes_directives_in_its_last_round_still_answers_without_them(start_proxy, upstream, api):
    upstream.default = lambda recorded: answer(api_of(recorded), 'Consult("more", "nope")')
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, max_rounds=2)
    reply = ask_in(proxy, api, long_history())
    assert said(api, reply) == "I could not find that in our conversation." and reply.headers["x-pcp-rounds"] == "2"
