"""Prompts a provider's cache can reuse: what a later round and a follow-up keep in place, and the cached tokens reported."""

from __future__ import annotations

import os
import re

import httpx
import pytest

from pcp_core.directives.replies import WorkerReply
from pcp_core.engine import kept_nodes
from proxy.settings import ModelSettings
from proxy.testing.apis import document_of, worker_document
from proxy.testing.upstream import completion
from tests.core.test_engine import context, doc, drive, summary_node_ids
from tests.proxy.helpers import long_history
from tests.proxy.hybrid_helpers import COUNT
from tests.proxy.telemetry_helpers import dated_chat


def consult_a_summary(call):
    return WorkerReply(text=f'Consult("more", "{summary_node_ids(call)[0]}")')


def flow(call) -> list[str]:
    return [node.get("id") for node in doc(call).find("Linear_Flow")]


def test_a_later_round_keeps_the_round_befores_first_nodes_in_place():
    calls, _, _ = drive([consult_a_summary, WorkerReply(text="done")], context(budget=4096))
    first, second = calls
    kept = kept_nodes(first.synthesis, context(budget=4096).policy)
    assert 3 <= len(kept) < len(flow(first))
    assert flow(second)[: len(kept)] == kept  # in their place, what the round brought after them
    shared = os.path.commonprefix([document_of(first.messages), document_of(second.messages)])
    assert len(shared) > 0.5 * len(document_of(first.messages))


def test_a_small_budget_keeps_room_for_what_a_consult_brings():
    calls, _, _ = drive([consult_a_summary, WorkerReply(text="done")], context(budget=2048))
    policy = context(budget=2048).policy
    assert all(start < policy.budget - policy.fresh_room for start in calls[0].synthesis.starts[: len(kept_nodes(calls[0].synthesis, policy))])


def test_a_paged_call_opens_as_the_clients_own_request_did(start_proxy, upstream):
    """The client's system prompt as its system message and its first message opening the user message, byte
    for byte: what a provider cached of the client's untouched requests is found again, from the first paged one.
    A first message longer than a quarter of the budget (the system prompt goes whole, on top of it) opens it cut,
    where it still starts as sent."""
    proxy = start_proxy(sentry_threshold=500, context_budget=2048)
    task = "Fix the failing test in calc/parser.py and run the suite. " * 60
    messages = [long_history()[0], {"role": "user", "content": task}, *long_history()[2:]]
    proxy.client().chat.completions.create(model="m", messages=messages)
    (system, user) = upstream.chat_requests("worker")[-1].json["messages"]
    assert system == messages[0] and user["role"] == "user"
    opening = user["content"][: user["content"].index("\n\n<PagedContext")]
    assert task.startswith(opening) and 2048 // 8 < COUNT(opening) <= 2048 // 4


def test_the_session_keeps_the_frame_for_the_next_request(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=2048)
    proxy.client().chat.completions.create(model="m", messages=long_history())
    first = worker_document(upstream.chat_requests("worker")[-1])
    follow_up = [*long_history(), {"role": "assistant", "content": "ok"}, {"role": "user", "content": "And my locker code again?"}]
    proxy.client().chat.completions.create(model="m", messages=follow_up)
    second = worker_document(upstream.chat_requests("worker")[-1])
    assert len(os.path.commonprefix([first, second])) > first.index("<Linear_Flow>") + 200  # into the pages, not only the instructions
    session = proxy.services.sessions.read(*_only_session(proxy))
    assert session.frame is not None and second.startswith(first[: first.index(session.frame.text[:200])])


def test_a_consult_on_a_page_the_stored_frame_shows_opens_what_holds_its_turns_now(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=2048)
    proxy.client().chat.completions.create(model="m", messages=long_history())
    frame = proxy.services.sessions.read(*_only_session(proxy)).frame  # read back from the store, as a follow-up finds it
    assert frame is not None and frame.spans.keys() == frame.shown.keys()
    said = [{"role": "assistant" if i % 2 == 0 else "user", "content": f"Turn {i}: the allotment's rhubarb and the rain."} for i in range(160, 172)]
    follow_up = [*long_history(), *said, {"role": "user", "content": "And the seedlings?"}]
    consult_all = "\n".join(f'Consult("more", "{page_id}")' for page_id in frame.shown)
    upstream.enqueue(completion(consult_all), completion("They are fine."))
    proxy.client().chat.completions.create(model="m", messages=follow_up)
    trace = doc_of(upstream.chat_requests("worker")[-1]).find("Reasoning_Trace")
    steps = [(step.get("action"), step.get("result", "")) for step in trace]
    assert steps and all(action == "Consult" for action, _ in steps)  # no Bus Fault: the last round would have had to answer
    assert any(" now stands as " in result for _, result in steps)  # the tree replaced some of them since the frame was made


def test_cached_tokens_the_upstream_reports_are_the_answering_calls(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=2048)

    def usage(cached: int | None):
        reply = completion("5521" if cached else 'Consult("more", "x")', prompt_tokens=2000)
        if cached is not None:
            import json

            body = json.loads(reply.body)
            body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
            reply.body = json.dumps(body).encode()
        return reply

    upstream.enqueue(usage(0), usage(1536))
    answer = proxy.client().chat.completions.create(model="m", messages=long_history())
    # The answering call's (the context the answer was read from): an agent measures its window by it.
    assert answer.usage.prompt_tokens == 2000 and answer.usage.prompt_tokens_details.cached_tokens == 1536

    upstream.enqueue(usage(None))
    raw = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()}).json()
    assert "prompt_tokens_details" not in raw["usage"]  # the upstream said nothing of a cache


def doc_of(request):
    from lxml import etree

    return etree.fromstring(worker_document(request))


def _only_session(proxy) -> tuple[str, str]:
    proxy.services.sessions.flush()
    ((namespace, session_id),) = proxy.services.sessions.stored()
    return namespace, session_id


def test_a_paged_request_names_its_session_to_openais_prompt_cache(start_proxy, upstream):
    keyed = start_proxy(sentry_threshold=500, context_budget=2048, prompt_cache_key="on")
    response = keyed.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()})
    key = upstream.chat_requests("worker")[-1].json["prompt_cache_key"]
    assert re.fullmatch(r"pcp-[0-9a-f]{32}", key) and response.headers["x-pcp-session"] not in key  # the session's, under the install's secret
    keyed.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history(), "prompt_cache_key": "mine"})
    assert upstream.chat_requests("worker")[-1].json["prompt_cache_key"] == "mine"  # the client's own is kept
    plain = start_proxy(sentry_threshold=500, context_budget=2048)  # auto: only to api.openai.com
    plain.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()})
    assert "prompt_cache_key" not in upstream.chat_requests("worker")[-1].json


def _cache_keys(upstream, since: int) -> set[str]:
    return {r.json["prompt_cache_key"] for r in upstream.requests[since:] if r.headers.get("x-pcp-role") == "worker"}


@pytest.mark.parametrize("path", ["/chat/completions", "/responses"])
def test_two_keys_naming_one_session_send_different_prompt_cache_keys(start_proxy, served_upstream, path):
    """A session id is the client's to choose: the cache key it sends upstream is bound to the caller's key as well, so
    one tenant never shares a provider's prompt cache with another (a timing side channel); a caller's follow-ups keep it."""
    proxy = start_proxy(sockets=True, upstream_base_url=served_upstream.url, sentry_threshold=500, context_budget=2048, prompt_cache_key="on")

    def ask(api_key: str, messages: list[dict]) -> set[str]:
        since = len(served_upstream.requests)
        body = (
            {"model": "m", "messages": messages}
            if path == "/chat/completions"
            else {"model": "m", "input": messages[1:], "instructions": messages[0]["content"]}
        )
        answer = httpx.post(f"{proxy.url}/v1{path}", json=body, headers={"authorization": f"Bearer {api_key}", "x-pcp-session": "team-chat"}, timeout=30)
        assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "protocol", answer.text
        assert answer.headers["x-pcp-session"] == "team-chat"
        return _cache_keys(served_upstream, since)

    follow_up = [*long_history(), {"role": "assistant", "content": "5521"}, {"role": "user", "content": "And the bike lock?"}]
    (alice,), (bob,) = ask("sk-alice", long_history()), ask("sk-bob", long_history())
    assert alice != bob
    assert "team-chat" not in alice + bob
    assert ask("sk-alice", follow_up) == {alice} and ask("sk-bob", follow_up) == {bob}  # stable: the cache still serves each


def _added_by_a_follow_up(proxy, upstream) -> int:
    """Tokens of a follow-up's worker prompt after what it shares with the request's before it (new to a provider's
    cache), the follow-up asking of another topic than the request before did."""
    history = dated_chat(400)
    proxy.client().chat.completions.create(model="m", messages=history)
    first = worker_document(upstream.chat_requests("worker")[-1])
    follow_up = [*history, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "What did we say about the espresso grinder?"}]
    proxy.client().chat.completions.create(model="m", messages=follow_up)
    second = worker_document(upstream.chat_requests("worker")[-1])
    return proxy.services.tokenizer.count(second[len(os.path.commonprefix([first, second])) :])


def test_followup_share_bounds_what_a_follow_up_adds(start_proxy, upstream, tmp_path):
    def added(name: str, **settings) -> int:  # a store each: the same conversation's sessions do not meet
        return _added_by_a_follow_up(start_proxy(sentry_threshold=500, context_budget=4096, data_dir=str(tmp_path / name), **settings), upstream)

    narrow, default = added("narrow", followup_share=0.05), added("default")
    by_model = added("by-model", models={"m": ModelSettings(followup_share=0.05)})
    assert narrow < 0.1 * 4096 < default  # a twentieth of the budget, against the default fifth
    assert by_model == narrow
