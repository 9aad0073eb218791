"""How a request goes (``pcp_core.decision.decide``): passthrough, protocol or refused, and why."""

from __future__ import annotations

from typing import get_args

import msgspec

from pcp_core import Policy, RoundPolicy
from pcp_core.decision import REASONS, Asked, Passthrough, Protocol, Reason, Refuse, decide

POLICY = Policy(threshold=1000, rounds=RoundPolicy(budget=600))


def fits(policy: Policy) -> bool:
    return True


def never(policy: Policy) -> bool:
    return False


def test_the_threshold_decides_an_automatic_request():
    assert decide(Asked(mode="auto", policy=POLICY, tokens=800), fits) == Passthrough("below-threshold")
    assert decide(Asked(mode="auto", policy=POLICY, tokens=1200), fits) == Protocol("threshold", POLICY)


def test_the_headers_win_over_the_threshold():
    assert decide(Asked(mode="off", policy=POLICY, tokens=50_000), fits) == Passthrough("off")
    assert decide(Asked(mode="force", policy=POLICY, tokens=10), fits) == Protocol("forced", POLICY)


def test_what_cannot_be_read_or_holds_no_messages_goes_untouched():
    assert decide(Asked(mode="force", policy=POLICY, readable=False), fits) == Passthrough("unread")
    assert decide(Asked(mode="force", policy=POLICY, messages=False), fits) == Passthrough("no-messages")


def test_a_conversation_that_fits_the_window_goes_untouched_while_paging_costs_more():
    fitting = Policy(threshold=1000, rounds=RoundPolicy(budget=4000), window=128_000)
    assert decide(Asked(mode="auto", policy=fitting, tokens=2400), fits) == Passthrough("cheaper-untouched")


def test_a_scope_with_pages_faults_memory_in_whatever_the_size():
    assert decide(Asked(mode="auto", policy=POLICY, tokens=10, faults=True), fits) == Protocol("memory", POLICY)


def test_a_forced_request_whose_budget_has_no_room_says_why_it_was_not_paged():
    assert decide(Asked(mode="force", policy=POLICY, tokens=10), never) == Passthrough("budget-full")
    small = msgspec.structs.replace(POLICY, window=5000)
    assert decide(Asked(mode="force", policy=small, tokens=9000), never) == Refuse("too-large", small)


def test_managed_context_narrows_the_budget_then_widens_it_until_it_pages():
    asked = Asked(mode="auto", policy=POLICY, tokens=3000, carried=100, managed="context-management", budget=500, most=2000)
    decided = decide(asked, lambda policy: policy.rounds.budget >= 1500)
    assert isinstance(decided, Protocol) and decided.reason == "context-management"
    assert decided.policy.rounds.budget == 2000  # 500, doubled to 1000, 2000 (its most)
    assert decide(Asked(mode="auto", policy=POLICY, tokens=3000, managed="context-management", budget=500), fits).policy.rounds.budget == 500
    assert decide(Asked(mode="off", policy=POLICY, tokens=3000, managed="compaction"), fits) == Passthrough("off")


def test_every_reason_is_explained():
    assert set(get_args(Reason)) == set(REASONS)


def test_a_request_refused_untouched_is_paged_within_the_window_it_named():
    small = Policy(threshold=100_000, rounds=RoundPolicy(budget=16_384), window=24_000)
    decided = decide(Asked(mode="auto", policy=small, tokens=20_000, carried=2_000, refused=True), fits)
    assert isinstance(decided, Protocol) and decided.reason == "refused-untouched"
    assert decided.policy.threshold == 21_000 and decided.policy.rounds.budget == 16_384  # the window less an eighth
    assert decide(Asked(mode="off", policy=small, tokens=20_000, refused=True), fits) == Passthrough("off")
