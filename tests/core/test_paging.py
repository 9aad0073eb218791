"""The Sentry and retroactive paging (§X), with extractive summaries."""

from __future__ import annotations

import pytest

from pcp_core.conversation import message_text, part_handle
from pcp_core.pages.logical import ConsolidatedPage, OriginalPage
from pcp_core.pages.summaries import extractive_summary
from pcp_core.paging.history import PagingPolicy, page_history, retroactive_paging, segment_turns, topic_groups, turns_from_messages
from pcp_core.request import Policy, engaged
from pcp_core.text.terms import terms, top_keywords

from .counting import COUNT

FILLER = ["That sounds lovely, tell me more about it.", "I have been busy with work lately, lots of meetings.", "The weather was grey all week here."]


def conversation(n: int) -> list[dict]:
    messages = []
    for i in range(n):
        text = FILLER[i % len(FILLER)]
        if i == 37:
            text = "Invoice INV-4471 for 1,250 EUR was paid by Marta Kowalski on 5 March 2024."
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"{text} (turn {i})"})
    return messages


def test_sentry_switches_above_the_threshold():
    policy = Policy(threshold=100)
    assert not engaged(100, policy)
    assert engaged(101, policy)


def test_segments_respect_token_and_turn_bounds():
    groups = segment_turns([30, 30, 30, 200, 10, 10, 10, 10], max_tokens=100, max_turns=3)
    assert groups == [range(0, 3), range(3, 4), range(4, 7), range(7, 8)]


def test_long_history_becomes_a_tree_of_depth_two_or_more():
    turns = turns_from_messages(conversation(300), "2026-11-22T10:00:00")
    index = retroactive_paging(turns, COUNT, PagingPolicy())
    leaves = list(index.leaves())

    assert max(p.depth for p in index) >= 2
    assert len(index.roots) <= PagingPolicy().max_roots
    assert all(isinstance(index.get(r), ConsolidatedPage) for r in index.roots)
    # Every turn lands in exactly one Original page, in order.
    covered = [i for page in leaves for i in range(page.first_turn, page.last_turn + 1)]
    assert covered == list(range(300))
    assert all(COUNT(p.content) <= PagingPolicy().page_tokens + 10 for p in leaves)
    # Children are one level deeper than their container.
    for page in index:
        if isinstance(page, ConsolidatedPage):
            assert {index.get(c).depth for c in page.source_ids} == {page.depth + 1}


def test_paging_is_deterministic():
    turns = turns_from_messages(conversation(120), "2026-11-22T10:00:00")
    first, second = retroactive_paging(turns, COUNT), retroactive_paging(turns, COUNT)
    assert list(first.pages) == list(second.pages)


def test_summaries_and_keywords_keep_anchors():
    turns = turns_from_messages(conversation(120), "2026-11-22T10:00:00")
    index = retroactive_paging(turns, COUNT)
    page = next(p for p in index.leaves() if p.first_turn <= 37 <= p.last_turn)
    anchors = {"inv-4471", "kowalski", "marta", "2024", "1,250"}
    assert anchors & set(page.keywords), page.keywords
    assert "INV-4471" in page.summary and "Marta Kowalski" in page.summary
    assert "Invoice INV-4471" in page.content


def test_message_timestamp_wins_over_seen_at():
    turns = turns_from_messages(
        [{"role": "user", "content": "hi", "timestamp": "2024-01-02T03:04:05"}, {"role": "assistant", "content": "yo"}], "2026-11-22T10:00:00"
    )
    assert [t.timestamp for t in turns] == ["2024-01-02T03:04:05", "2026-11-22T10:00:00"]


def test_oversized_turn_is_split_across_pages():
    big = " ".join(f"word{i}" for i in range(500))  # longer than a page, not long enough to be a PBlock
    assert PagingPolicy().page_tokens * 3 < COUNT(big) < PagingPolicy().blocks.block_tokens
    index = retroactive_paging(turns_from_messages([{"role": "user", "content": big}], "t"), COUNT)
    leaves = list(index.leaves())
    assert len(leaves) > 3 and all(p.first_turn == 0 for p in leaves)
    assert " ".join(p.content.removeprefix("[user] ") for p in leaves) == big


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (
            {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]},
            f"look [image_url {part_handle({'type': 'image_url', 'image_url': {'url': 'x'}})}]",
        ),
        ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}, "\n(calls f({}))"),
        ({"role": "user", "name": "bob", "content": "hi"}, "bob: hi"),
    ],
)
def test_message_text(message, text):
    assert message_text(message) == text


def test_extractive_summary_prefers_weighted_sentences_and_fits():
    text = "We chatted. The deploy of api-v2 failed at 03:14 on host db-7. Nice day."
    weights = {t: 1.0 for t in terms("api-v2 03:14 db-7 deploy")}
    summary = extractive_summary(text, weights, max_chars=60)
    assert summary == "The deploy of api-v2 failed at 03:14 on host db-7."
    assert len(extractive_summary(text * 20, weights, max_chars=50)) <= 50


def test_a_summary_passes_over_a_weightier_sentence_too_long_for_what_is_left_and_takes_a_shorter_one():
    text = "Marta paid invoice INV-4471 in March. The invoice for the roof repair by Kowalski and Sons is still open. Roof done."
    weights = {t: 1.0 for t in terms("marta paid invoice inv-4471 march roof repair kowalski sons open done")}
    assert extractive_summary(text, weights, max_chars=60) == "Marta paid invoice INV-4471 in March. Roof done."


def test_a_summary_no_sentence_fits_is_its_weightiest_sentence_cut_not_its_first():
    text = "We talked for a long while about nothing in particular at all. Marta Kowalski paid invoice INV-4471 for the roof in March 2024."
    weights = {t: 1.0 for t in terms("marta kowalski invoice inv-4471 roof march 2024")}
    summary = extractive_summary(text, weights, max_chars=40)
    assert summary.startswith("Marta Kowalski paid") and summary.endswith("…") and len(summary) <= 40


def test_keywords_are_the_weightiest_terms_ties_by_name_never_a_time_of_day():
    weights = {"14:30": 9.0, "zinc": 2.0, "alder": 2.0, "roof": 3.0, "2024": 1.0, "moss": 0.5}
    assert top_keywords(weights, 3) == ("roof", "alder", "zinc")
    assert top_keywords(weights, 9) == ("roof", "alder", "zinc", "2024", "moss")
    assert top_keywords(weights, 0) == ()


def test_each_sentence_keeps_its_own_speaker_when_a_line_holds_several():
    # A container summarises its children's summaries, whose lines hold several speakers.
    line = "Melanie: I ran a charity race last Saturday. Caroline: That race sounds great! It raised money too. Melanie:"
    weights = {t: 1.0 for t in terms("charity race saturday raised money")}
    summary = extractive_summary(line, weights, max_chars=200)
    assert summary == "Melanie: I ran a charity race last Saturday. Caroline: That race sounds great! Caroline: It raised money too."


def test_original_pages_are_original():
    index = retroactive_paging(turns_from_messages(conversation(10), "t"), COUNT)
    assert all(isinstance(p, OriginalPage) for p in index.leaves())


# -- topic pivots (§VI.5) --------------------------------------------------------------------


def dated_conversation() -> list[dict]:
    messages = []
    for session, (date, subject) in enumerate([("8 May, 2023", "the marathon training plan"), ("25 May, 2023", "adopting a puppy from the shelter")]):
        for i in range(14):
            text = f"We keep talking about {subject}, part {i}."
            if i == 0:
                text = f"[Session {session + 1} - 1:56 pm on {date}]\n{text}"
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


def test_a_dated_header_starts_a_page_and_a_topic():
    paged = page_history(turns_from_messages(dated_conversation(), "t"), COUNT, PagingPolicy(max_roots=1))
    header = next(p for p in paged.leaves if "[Session 2" in p.content)
    assert header.first_turn == 14 and header.content.startswith("[user] [Session 2")
    groups = topic_groups(paged.leaves, paged.df, PagingPolicy())
    assert [g[0].first_turn for g in groups if "[Session" in g[0].content] == [0, 14]
    assert all(len(g) <= PagingPolicy().max_fanout for g in groups)


def test_topic_groups_cut_where_the_subject_changes():
    policy = PagingPolicy(min_fanout=2, max_fanout=8, pivot_overlap=0.2)
    messages = [{"role": "user", "content": f"The garden roses need pruning and compost, bed {i}."} for i in range(12)]
    messages += [{"role": "user", "content": f"The tax return deadline and receipts for the accountant, form {i + 100}."} for i in range(12)]
    paged = page_history(turns_from_messages(messages, "t"), COUNT, policy)
    groups = topic_groups(paged.leaves, paged.df, policy)
    assert any(g[0].first_turn == 12 for g in groups)  # a group starts where the subject changes
    assert not any(g[0].first_turn < 12 < g[-1].last_turn for g in groups)  # and none straddles it
