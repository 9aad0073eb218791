"""The head a worker call carries whole: the client's system prompt and tool definitions ride on top of the budget."""

from __future__ import annotations

import json

from pcp_core.conversation import Conversation
from pcp_core.prompt.synthesis import synthesize
from pcp_core.prompt.synthesis_types import SynthesisRequest
from pcp_core.request import Policy, engaged, head_tokens, pageable
from pcp_core.round_policy import RoundPolicy

from .counting import COUNT
from .helpers import two_level_tree

TOOLS = [{"name": f"Tool{i}", "description": "Reads the repository's files and reports on them. " * 60, "input_schema": {"type": "object"}} for i in range(24)]


def test_a_request_is_pageable_whatever_its_tools_weigh():
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}, {"role": "assistant", "content": "ok"}]
    conversation = Conversation.of([*messages, {"role": "user", "content": "Run the tests."}], Policy().paging.blocks, COUNT)
    assert COUNT(json.dumps(TOOLS)) > 4096
    assert pageable(conversation, Policy(rounds=RoundPolicy(budget=4096)), COUNT)
    assert not pageable(conversation, Policy(rounds=RoundPolicy(budget=100)), COUNT)  # the instructions alone do not fit


def test_the_sentry_weighs_what_is_paged_not_the_head_both_ways_carry():
    rounds = RoundPolicy(budget=16_384, cached_input_price=0.1)
    policy = Policy(threshold=32_768, rounds=rounds, window=200_000)
    assert engaged(55_000, policy)  # past ~2.35x the budget: paging pays
    assert not engaged(55_000, policy, carried=20_000)  # 35k of history beside a 20k head both ways carry: not yet
    assert engaged(80_000, policy, carried=20_000)


def test_a_carried_head_goes_whole_and_the_pages_get_the_budget():
    head = "You are a coding agent. Follow the rules of the repository. " * 200  # ~2.4k tokens: over a quarter of 2,048
    index, _ = two_level_tree()
    views: dict = {}
    carried = head_tokens(head, [], COUNT)
    budget = 2048
    request = SynthesisRequest(current_time="2026-01-01T00:00", query="What broke?", head=head, budget=budget + carried, carried=carried)
    synthesis = synthesize(index, views, request, COUNT)
    assert synthesis.messages[0] == {"role": "system", "content": head}  # whole, as the client sent it
    assert synthesis.tokens <= budget + carried
    clipped = synthesize(index, views, SynthesisRequest(current_time="2026-01-01T00:00", query="What broke?", head=head, budget=budget), COUNT)
    assert clipped.messages[0]["content"] != head  # within the budget, as before, it is clipped
