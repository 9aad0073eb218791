"""The frame a conversation keeps for providers' prompt caches: made, replayed byte for byte, extended, made again."""

from __future__ import annotations

import os
import re

import msgspec

from pcp_core.decision import Asked, decide
from pcp_core.directives.replies import WorkerReply
from pcp_core.paging.history import retroactive_paging, turns_from_messages
from pcp_core.prompt.frame import continues, prompt_text
from pcp_core.request import Policy, within_conversation, within_window
from pcp_core.round_policy import RoundPolicy
from pcp_core.session import chain_links

from .counting import COUNT
from .helpers import paged
from .test_engine import context, doc, drive, history


def _turns(start: int, n: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Later remark {i} about the hedge and the roses."} for i in range(start, start + n)]


def _follow_up(first_call, messages, query: str, budget: int = 4096):
    """Round 0 of the request after ``first_call``'s: ``messages`` of history, going on from its frame."""
    ctx = context(budget=budget, query=query, frame=first_call.frame, query_link="next", query_at=len(messages))
    index = retroactive_paging(turns_from_messages(messages, "2026-11-22T09:00:00"), COUNT)
    calls, _, _ = drive([WorkerReply(text="done")], ctx, messages)
    return calls[0], index


def _document(call) -> str:
    return paged(call.messages)


def test_a_request_makes_a_frame_its_document_opens_with():
    call = drive([WorkerReply(text="Biscuit.")], context(budget=4096))[0][0]
    frame = call.frame
    assert frame is not None and frame.text.startswith(("<Background_Context>", "<Linear_Flow>"))
    registry_end = _document(call).index("</Static_Registry>\n") + len("</Static_Registry>\n")
    assert _document(call)[registry_end:].startswith(frame.text)
    assert frame.tokens <= 0.25 * 4096  # made small: it grows by the turns said after it
    assert frame.shown and all(page in call.synthesis.shown for page in frame.shown)


def test_a_follow_up_replays_the_frame_and_appends_the_turns_said_since():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=4096))[0][0]
    messages = [*history(), *_turns(240, 12)]
    second, _ = _follow_up(first, messages, "What about the roses?")
    before, after = _document(first), _document(second)
    prefix = before[: before.index(first.frame.text) + len(first.frame.text)]
    assert after.startswith(prefix)  # byte for byte: a provider's cache reads all of it
    appended = after[len(prefix) : len(prefix) + len(second.frame.text) - len(first.frame.text)]
    assert "Later remark 240 about the hedge" in appended and "Later remark 247 about the hedge" in appended
    assert "Later remark 248 about the hedge" in after[len(prefix) + len(appended) :]  # the last page, still open: after the frame
    assert second.frame.text.startswith(first.frame.text) and second.frame.at == len(messages)
    assert second.synthesis.tokens <= 4096


def test_what_a_follow_up_adds_after_its_frame_keeps_to_its_share():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=4096))[0][0]
    second, _ = _follow_up(first, [*history(), *_turns(240, 2)], "What was the name of Ingrid's greyhound again?")
    fresh = _document(second)[second.synthesis.frame_end : _document(second).index("</Linear_Flow>")]
    assert COUNT(fresh) <= RoundPolicy().followup_share * 4096  # its share, less the turns since and the query
    assert "Biscuit" in fresh or "Biscuit" in second.frame.text  # the evidence is there


def test_a_frame_that_outgrows_its_room_is_made_again():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=2048))[0][0]
    second, _ = _follow_up(first, [*history(), *_turns(240, 120)], "What about the roses?", budget=2048)
    assert not second.frame.text.startswith(first.frame.text)  # made again: a boundary, like a log's compaction
    assert second.frame.tokens <= 0.25 * 2048 and second.synthesis.tokens <= 2048


def test_a_follow_up_that_makes_its_frame_again_adds_no_more_than_its_share():
    budget = 2048
    first = drive([WorkerReply(text="Biscuit.")], context(budget=budget))[0][0]
    second, _ = _follow_up(first, [*history(), *_turns(240, 120)], "What was the name of Ingrid's greyhound again?", budget=budget)
    document = _document(second)
    assert not second.frame.text.startswith(first.frame.text)  # made again: all of it is new to the cache
    after_frame = document[second.synthesis.frame_end : document.index("</Linear_Flow>")]
    pages = after_frame[: after_frame.rfind("<Node id=")]  # the last page, still open, stays whatever the share
    assert COUNT(pages) <= max(RoundPolicy().followup_share * budget - second.frame.tokens, 0)  # the new frame took its share


def test_later_rounds_replay_the_frame_round_zero_made():
    def consult(call):
        target = next(n.get("id") for n in doc(call).iter("Node") if n.get("view") == "Summary")
        return WorkerReply(text=f'Consult("more", "{target}")')

    calls, _, _ = drive([consult, WorkerReply(text="done")], context(budget=4096))
    first, second = calls
    assert first.frame is not None and second.frame.text == first.frame.text
    assert _document(second)[: first.synthesis.frame_end] == _document(first)[: first.synthesis.frame_end]


def test_a_consult_on_a_page_the_tree_has_since_replaced_opens_what_holds_its_turns_now():
    (first,), _, before = drive([WorkerReply(text="Biscuit.")], context(budget=4096))
    messages = [*history(), *_turns(240, 12)]
    index = retroactive_paging(turns_from_messages(messages, "2026-11-22T09:00:00"), COUNT)
    replaced = [page_id for page_id in first.frame.shown if page_id not in index.pages]
    assert replaced  # the turns said since went into the containers the frame shows: they have new ids
    target = replaced[0]
    first_turn, last_turn = before.get(target).first_turn, before.get(target).last_turn
    ctx = context(budget=4096, query="What about the roses?", frame=first.frame, query_link="next", query_at=len(messages))
    calls, outcome, index = drive([WorkerReply(text=f'Consult("more", "{target}")'), WorkerReply(text="done")], ctx, messages)
    step = outcome.trace[0]
    assert step.action == "Consult" and step.target != target  # not a Bus Fault, which would cost the request its rounds
    assert step.result.startswith(f"{target} now stands as {step.target};")  # the worker reads where the page went
    opened = index.get(step.target)
    assert opened.first_turn <= first_turn and opened.last_turn >= last_turn
    assert f'<Node id="{step.target}"' in _document(calls[1])[calls[1].synthesis.frame_end :]


def test_without_a_cache_no_frame_is_kept():
    call = drive([WorkerReply(text="Biscuit.")], context(budget=4096, cached_input_price=1.0))[0][0]
    assert call.frame is None


def test_a_follow_up_goes_on_from_the_frame_a_sibling_does_not():
    history_links = chain_links(history())
    question = {"role": "user", "content": "What is the greyhound's name?"}
    line = chain_links([question], after=history_links[-1])[0]
    first = drive([WorkerReply(text="Biscuit.")], context(budget=4096, query_link=line, query_at=len(history_links)))[0][0]
    follow_up = chain_links([*history(), question, {"role": "assistant", "content": "Biscuit."}])
    edited = chain_links([*history(), {"role": "user", "content": "Where does Ingrid live?"}, {"role": "assistant", "content": "Oslo."}])
    assert continues(first.frame, follow_up)
    assert not continues(first.frame, edited)  # the question asked again otherwise: ranked afresh
    assert not continues(first.frame, history_links)  # the same history, another question


def test_paging_pays_once_the_conversation_outgrows_what_its_cached_prefix_would_cost():
    from pcp_core.request import paging_pays
    from pcp_core.round_policy import RoundPolicy

    cached = RoundPolicy(budget=4096, cached_input_price=0.1, followup_share=0.125)  # crossover: 3,584 + 512 / 0.1 = 8,704
    assert not paging_pays(8_000, cached) and paging_pays(9_000, cached)
    assert paging_pays(4_097, RoundPolicy(budget=4096, cached_input_price=1.0))  # nothing cached: tokens are the bill
    assert not paging_pays(4_097 * 100, RoundPolicy(budget=4096, cached_input_price=0.0))  # a local slot: the prefix is free


def test_the_sentry_forwards_what_fits_the_window_while_paging_costs_more():
    from pcp_core.request import Policy, engaged
    from pcp_core.round_policy import RoundPolicy

    rounds = RoundPolicy(budget=4096, cached_input_price=0.1)
    assert engaged(9_000, Policy(threshold=8192, rounds=rounds))  # the window unknown: the threshold alone
    assert not engaged(8_500, Policy(threshold=8192, rounds=rounds, window=128_000))  # fits, and is cheaper untouched
    assert engaged(20_000, Policy(threshold=8192, rounds=rounds, window=128_000))  # paging pays
    assert engaged(8_500, Policy(threshold=8192, rounds=rounds, window=8_400))  # past the window: paged whatever it costs
    assert not engaged(5_000, Policy(threshold=8192, rounds=rounds, window=128_000))


def test_pages_ranked_again_keep_their_place_with_the_pages_shown_before_them():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=4096))[0][0]
    after = first.frame.after
    # The small talk ranks some of what the first request showed after its frame, not the first of it.
    second, _ = _follow_up(first, [*history(), *_turns(240, 2)], "small talk number 7")
    run = max(k for k in range(len(after) + 1) if second.frame.text.startswith(first.frame.text + "".join(shown.text for shown in after[:k])))
    assert run >= 4  # kept in their place, those before the ones ranked again too: all from the cache
    before, now = _document(first), _document(second)
    assert os.path.commonprefix([before, now]).startswith(before[: before.index(after[run - 1].text) + len(after[run - 1].text)])
    assert COUNT("".join(shown.text for shown in after[:run])) <= RoundPolicy().followup_share * 4096  # within a follow-up's share


def test_pages_ranked_again_keep_their_place_after_the_frame():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=4096))[0][0]
    assert first.frame.after, "the request showed pages after its frame"
    second, _ = _follow_up(first, [*history(), *_turns(240, 2)], "What is the name of Ingrid's greyhound?")
    kept = first.frame.after[0]
    assert "Biscuit" in kept.text  # the evidence the first request showed, which this one ranks again
    assert second.frame.text.startswith(first.frame.text + kept.text)  # it follows the frame, as it did: billed once
    before, after = _document(first), _document(second)
    assert os.path.commonprefix([before, after]).startswith(before[: before.index(kept.text) + len(kept.text)])
    unrelated, _ = _follow_up(first, [*history(), *_turns(240, 2)], "What about the roses in the hedge?")
    assert not unrelated.frame.text.startswith(first.frame.text + kept.text)  # what no longer ranks is not kept


# -- a frame carried on top of the budget (``cached_budget``): what the conversation asked for stays in view --


def _carried_follow_up(first_call, messages, query: str, replies=(), budget: int = 2048, cached_budget: int = 2048, **policy):
    """The request after ``first_call``'s with the frame carried on top of the budget: its calls."""
    ctx = context(budget=budget, cached_budget=cached_budget, query=query, frame=first_call.frame, query_link="next", query_at=len(messages), **policy)
    calls, _, _ = drive([*replies, WorkerReply(text="done")], ctx, messages)
    return calls


def _consult_a_summary(call):
    target = next(n.get("id") for n in doc(call).iter("Node") if n.get("view") == "Summary")
    return WorkerReply(text=f'Consult("more", "{target}")')


def test_a_follow_up_keeps_all_the_request_before_showed_after_its_frame():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=2048, cached_budget=2048))[0][0]
    assert len(first.frame.after) >= 4
    (second,) = _carried_follow_up(first, [*history(), *_turns(240, 2)], "What about the roses in the hedge?")
    kept = first.frame.text + "".join(shown.text for shown in first.frame.after)
    assert second.frame.text.startswith(kept)  # what no longer ranks stays too: a provider's cache reads it
    assert _document(second).startswith(_document(first)[: _document(first).index(kept) + len(kept)])
    # On top of the budget by the frame alone: what it adds stays within a follow-up's share.
    assert 2048 < second.synthesis.tokens <= 2048 + min(second.frame.tokens, 2048)
    fresh = _document(second)[second.synthesis.frame_end : _document(second).index("</Linear_Flow>")]
    assert COUNT(fresh) <= RoundPolicy().followup_share * 2048 + 200  # the share, and the last page that stays whatever it is


def test_where_the_budget_holds_the_frame_only_pages_ranked_again_stay():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=2048))[0][0]
    second, _ = _follow_up(first, [*history(), *_turns(240, 2)], "What about the roses in the hedge?", budget=2048)
    kept = first.frame.text + "".join(shown.text for shown in first.frame.after)
    assert not second.frame.text.startswith(kept) and second.synthesis.tokens <= 2048


def test_a_later_round_of_a_follow_up_adds_after_the_round_before():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=2048, cached_budget=2048))[0][0]
    messages = [*history(), *_turns(240, 2)]
    calls = _carried_follow_up(first, messages, "What about the roses in the hedge?", replies=[_consult_a_summary, _consult_a_summary], followup_rounds=3)
    assert len(calls) == 3
    share = RoundPolicy().followup_share * 2048
    for before, after in zip(calls, calls[1:]):
        shown = _document(before)[: _document(before).rindex("<Node id=")]  # all but the last page, still open
        assert _document(after).startswith(shown)  # in place: a Consult costs what it brings, the rest is cached
        assert COUNT(_document(after)) - COUNT(_document(before)) <= share + 100  # its share, and the trace's step


def test_a_frame_carried_on_top_of_the_budget_is_made_again_once_it_outgrows_that():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=2048, cached_budget=1024))[0][0]
    (second,) = _carried_follow_up(first, [*history(), *_turns(240, 120)], "What about the roses?", cached_budget=1024)
    assert not second.frame.text.startswith(first.frame.text)
    assert second.synthesis.tokens <= 2048 + 1024


def test_the_blocks_a_follow_up_cuts_its_prompt_into_end_where_the_requests_before_put_their_entries():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=2048, cached_budget=2048))[0][0]
    messages = [*history(), *_turns(240, 2)]
    (second,) = _carried_follow_up(first, messages, "What about the roses in the hedge?")
    ctx = context(budget=2048, cached_budget=2048, query="And the greyhound?", frame=second.frame, query_link="then", query_at=len(messages) + 2)
    (third,), _, _ = drive([WorkerReply(text="done")], ctx, [*messages, *_turns(242, 2)])
    text, before = prompt_text(third.messages), prompt_text(second.messages)
    ends = {cut for cut in third.cuts}
    # The entry the request before wrote at the end of what it showed is a block's end here too, and so is its own.
    assert any(text[:cut] == before[:cut] and cut in second.marks for cut in ends if cut <= len(before))
    assert set(cut for cut in second.cuts if text[:cut] == before[:cut]) <= ends


def test_a_frame_on_top_of_the_budget_takes_no_more_than_a_third_of_the_conversation_and_what_the_window_leaves():
    policy = Policy(rounds=RoundPolicy(budget=4096, cached_budget=6144))
    assert within_conversation(policy, 40_000).rounds.cached_budget == 6144
    assert within_conversation(policy, 9_000).rounds.cached_budget == 3000  # untouched, the cache would read it all
    windowed = within_window(msgspec.structs.replace(policy, window=16_000), carried=1_000)
    assert windowed.rounds.cached_budget == 16_000 - 2_000 - 1_000 - 2 * 4096  # a budget left for what later rounds add
    assert within_window(msgspec.structs.replace(policy, window=8_000), carried=1_000).rounds.cached_budget == 0
    asked = Asked(policy=policy, tokens=9_000 + 500, carried=500, mode="force")
    assert decide(asked, lambda _: True).policy.rounds.cached_budget == 3000


def test_a_consult_in_a_follow_up_with_its_frame_on_top_brings_the_page_it_asks_for():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=2048, cached_budget=2048))[0][0]
    messages = [*history(), *_turns(240, 2)]
    asked: list[str] = []

    def consult_the_last_summary(call):  # a page round 0 shows by its summary only, after its frame
        asked.append([n.get("id") for n in doc(call).iter("Node") if n.get("view") == "Summary"][-1])
        return WorkerReply(text=f'Consult("more", "{asked[-1]}")')

    calls = _carried_follow_up(first, messages, "What about the roses in the hedge?", replies=[consult_the_last_summary])
    before, after = _document(calls[0]), _document(calls[1])
    added = after[len(before[: before.rindex("<Node id=")]) :]  # what the Consult's round shows after the round before
    shown = re.search(rf'<Node id="{asked[0]}"[^>]*>\n(<Content>|<Node)', added)  # its words, or its pages: not left at its summary
    assert shown and 'view="Summary"' not in shown.group(0)


def test_a_follow_up_with_its_frame_on_top_calls_the_worker_at_most_followup_rounds_times():
    first, consulting = drive([WorkerReply(text="Biscuit.")], context(budget=2048, cached_budget=2048))[0][0], [_consult_a_summary] * 4
    messages = [*history(), *_turns(240, 2)]
    calls = _carried_follow_up(first, messages, "What about the roses in the hedge?", replies=consulting)
    assert len(calls) == RoundPolicy().followup_rounds == 2  # one Consult, then the worker answers
    assert doc(calls[-1]).find("ST-Node[@id='FINAL_ROUND']") is not None
    # A request ranked afresh keeps max_rounds, and so does a follow-up where the budget holds the frame (a set one).
    assert len(drive([*consulting, WorkerReply(text="done")], context(budget=2048, cached_budget=2048))[0]) == 4
    ctx = context(budget=2048, query="What about the roses in the hedge?", frame=first.frame, query_link="next", query_at=len(messages))
    assert len(drive([*consulting, WorkerReply(text="done")], ctx, messages)[0]) == 4


def test_a_later_round_of_a_follow_up_replays_the_round_before_however_near_its_frame_is_to_its_allowance():
    first = drive([WorkerReply(text="Biscuit.")], context(budget=2048, cached_budget=2048))[0][0]
    messages = [*history(), *_turns(240, 2)]
    for allowance in range(256, 2048, 128):  # up to a frame past its allowance by what a budget leaves beside the fixed parts
        calls = _carried_follow_up(first, messages, "What about the roses in the hedge?", replies=[_consult_a_summary], cached_budget=allowance)
        shown = _document(calls[0])[: _document(calls[0]).rindex("<Node id=")]
        # The Consult's round adds its share after round 0: it does not make the frame again, small, and lose what round 0 showed.
        assert len(calls) == 2 and _document(calls[1]).startswith(shown), allowance
