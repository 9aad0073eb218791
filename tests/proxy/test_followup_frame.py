"""A chat's follow-ups at the proxy's default budget: the frame a provider's cache serves grows on top of the budget,
keeps what the requests before showed, and a set budget stays the cap."""

from __future__ import annotations

import os
import re

import pytest

from pcp_core import Policy, RoundPolicy, head_tokens, with_cached_frame
from pcp_core.text.tokens import prompt_tokens
from proxy.settings import CHAT_BUDGET, ModelSettings
from proxy.testing.apis import message, worker_document
from proxy.testing.prompt_cache import PromptCache
from proxy.testing.replies import Recorded
from proxy.testing.upstream import completion
from tests.proxy.telemetry_helpers import dated_chat

QUESTIONS = ("What did we say about the espresso grinder?", "And the bike lock?", "Which day was the hike?", "What is my gym locker code?")
ALLOWANCE = with_cached_frame(Policy(rounds=RoundPolicy(budget=CHAT_BUDGET))).rounds.cached_budget


def _chat(proxy, upstream, turns: int = 400, rounds: bool = False, **headers: str) -> list[Recorded]:
    """A long chat, then its questions one after the other: the round-0 worker call of each request (``rounds``:
    each request's worker calls, the worker Consulting the first summary it reads once)."""
    history, calls = dated_chat(turns)[:-1], []
    for question in QUESTIONS:
        history = [*history, {"role": "user", "content": question}]
        since = len(upstream.requests)
        if rounds:
            upstream.enqueue(_consulting, completion("done"))
        response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": history}, headers=headers)
        assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol", response.text
        made = [r for r in upstream.requests[since:] if r.headers.get("x-pcp-role") == "worker"]
        calls += made if rounds else made[:1]
        history = [*history, {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}]
    return calls


def _consulting(recorded: Recorded):
    """A worker that Consults the first page its prompt shows by its summary."""
    target = re.search(r'<Node id="([^"]+)"[^>]*view="Summary"', worker_document(recorded))
    return completion(f'Consult("more", "{target.group(1)}")' if target else "done")


def _tokens(proxy, call: Recorded) -> int:
    return prompt_tokens(call.json["messages"], proxy.services.tokenizer.count)


def test_the_default_budget_carries_a_frame_of_cached_tokens_on_top():
    assert int(RoundPolicy().followup_share * CHAT_BUDGET / RoundPolicy().cached_input_price) == ALLOWANCE  # as dear as a follow-up's share
    assert with_cached_frame(Policy(rounds=RoundPolicy(cached_input_price=1.0))).rounds.cached_budget == 0  # nothing is cached
    assert with_cached_frame(Policy(rounds=RoundPolicy(cached_input_price=0.0))).rounds.cached_budget == 4 * RoundPolicy().budget  # a slot keeps it


def test_a_follow_up_at_the_default_budget_keeps_what_the_request_before_showed(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500)
    firsts = _chat(proxy, upstream)
    sizes = [_tokens(proxy, call) for call in firsts]
    assert max(sizes[1:]) > CHAT_BUDGET  # the frame on top of the budget
    assert all(size <= CHAT_BUDGET + ALLOWANCE for size in sizes)
    documents = [worker_document(call) for call in firsts]
    for before, after in zip(documents[1:], documents[2:]):
        shown = before[: before.rindex("<Node id=")]  # all the request before showed, but its last page (still open)
        assert after.startswith(shown)  # a provider's cache serves it
    count = proxy.services.tokenizer.count
    added = [count(after[len(os.path.commonprefix([before, after])) :]) for before, after in zip(documents[1:], documents[2:])]
    assert all(tokens <= RoundPolicy().followup_share * CHAT_BUDGET + 200 for tokens in added)  # its share, the last page and the query


@pytest.mark.parametrize("capped", ["settings", "model", "header"])
def test_a_budget_a_user_sets_stays_the_cap(start_proxy, upstream, capped):
    settings = {"settings": {"context_budget": CHAT_BUDGET}, "model": {"models": {"m": ModelSettings(context_budget=CHAT_BUDGET)}}}.get(capped, {})
    proxy = start_proxy(sentry_threshold=500, **settings)
    calls = _chat(proxy, upstream, rounds=True, **({"x-pcp-budget": str(CHAT_BUDGET)} if capped == "header" else {}))
    head = head_tokens(dated_chat()[0]["content"], [], proxy.services.tokenizer.count)  # on top of the budget, whole
    assert len(calls) >= 2 * len(QUESTIONS) and all(_tokens(proxy, call) <= CHAT_BUDGET + head for call in calls)  # later rounds too


def test_a_coding_agents_family_keeps_its_own_budget_as_the_cap(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500)
    control = proxy.services.controls.for_model("claude-sonnet-4-5")
    assert control.policy.rounds.cached_budget == 0 and proxy.services.controls.for_model("m").policy.rounds.cached_budget == ALLOWANCE


def test_anthropics_cache_reads_what_the_request_before_showed(start_proxy, upstream):
    """Through the Messages API, in front of a cache that keeps Anthropic's rules: each follow-up's first call reads the
    request before's prompt from the cache (an entry ends where it showed its last page), and writes only what it adds."""
    count = start_proxy(sentry_threshold=500).services.tokenizer.count
    cache = PromptCache(count)
    upstream.default = cache.replying(lambda recorded: message("ok"))
    proxy = start_proxy(sentry_threshold=500)
    history, usages = dated_chat(400)[1:-1], []
    for question in QUESTIONS:
        history = [*history, {"role": "user", "content": question}]
        since = len(cache.calls)
        response = proxy.http.post("/v1/messages", json={"model": "m", "max_tokens": 64, "messages": history})
        assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol", response.text
        usages.append(cache.calls[since])
        history = [*history, {"role": "assistant", "content": "ok"}]
    for before, after in zip(usages[1:], usages[2:]):
        read, total = after["cache_read_input_tokens"], sum(after.values())
        assert read >= sum(before.values()) - 400  # all the request before showed, but its last page and its query
        assert after["input_tokens"] + after["cache_creation_input_tokens"] <= RoundPolicy().followup_share * CHAT_BUDGET + 400
        assert read > 0.7 * total


@pytest.mark.parametrize("rounds", [None, 3])
def test_a_follow_up_at_the_default_budget_calls_the_worker_at_most_followup_rounds_times(start_proxy, upstream, rounds):
    proxy = start_proxy(sentry_threshold=500, **({"followup_rounds": rounds} if rounds else {}))
    upstream.default = _consulting  # a worker that Consults for as long as it may
    history, made = dated_chat(400)[:-1], []
    for question in QUESTIONS:
        history = [*history, {"role": "user", "content": question}]
        since = len(upstream.requests)
        response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": history})
        assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol", response.text
        made.append(sum(r.headers.get("x-pcp-role") == "worker" for r in upstream.requests[since:]))
        history = [*history, {"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]}]
    assert made[0] == RoundPolicy().max_rounds  # the first request, ranked afresh with the whole budget
    assert made[1:] == [rounds or RoundPolicy().followup_rounds] * (len(QUESTIONS) - 1)
