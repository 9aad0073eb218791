"""Memory that stays useful as it grows (``pcp_core.memory``): novelty, pages that only ask, repeats, the Router's tiers, metabolism."""

from __future__ import annotations

from datetime import datetime

from pcp_core.effects import Outcome
from pcp_core.memory import (
    Candidate,
    MemoryIntake,
    MemoryPolicy,
    Metabolism,
    asks,
    content_terms,
    decay,
    memory_use,
    novelty,
    ranked,
    repeats,
    rise,
    selection,
    vitality,
)
from pcp_core.pages.index import Activation, PageState
from pcp_core.pages.logical import ConsolidatedPage, Origin, OriginalPage, short_hash
from pcp_core.prompt.synthesis_types import Step
from pcp_core.ranking.router import Intent, anchor_intent

from .counting import COUNT

SAID = [
    "[user] Caroline: I went to a LGBTQ support group yesterday and it was so powerful.\n[assistant] Melanie: Wow, that's cool! What happened there?",
    "[user] Caroline: The transgender stories were so inspiring, I felt accepted.\n[assistant] Melanie: So glad you found such a helpful group.",
    "[user] Melanie: I painted a lake sunrise last year, it's special to me.\n[assistant] Caroline: That painting is gorgeous, Mel!",
    "[user] Melanie: We went camping at the beach with the kids in June.\n[assistant] Caroline: Sounds like a lovely family trip.",
]


def page(content: str, timestamp: str = "2023-05-08T10:00:00", first: int = 0) -> OriginalPage:
    return OriginalPage(
        id=short_hash("Memory", content, length=12), origin=Origin.STORAGE, depth=1, timestamp=timestamp,
        keywords=(), summary=content[:60], content=content, first_turn=first, last_turn=first,
    )  # fmt: skip


def scope(texts=SAID) -> tuple[list[OriginalPage], dict[str, int], int]:
    """Pages, and the document frequencies of their terms (as the keyword index holds them)."""
    pages = [page(text, first=i) for i, text in enumerate(texts)]
    df: dict[str, int] = {}
    for p in pages:
        for term in content_terms(p):
            df[term] = df.get(term, 0) + 1
    return pages, df, len(pages)


def held(pages) -> list[set[str]]:
    return [content_terms(p) for p in pages]


def test_a_question_about_what_the_scope_holds_brings_nothing_new():
    pages, df, n = scope()
    question = page("[user] When did Caroline go to the LGBTQ support group?")
    assert novelty(question, held(pages), df, n) < MemoryIntake().novel
    assert asks(question)


def test_a_statement_with_a_new_name_informs_and_one_new_fact_keeps_small_talk():
    pages, df, n = scope()
    told = page("[user] My sister Beatrix moved to Lisbon in March.")
    assert novelty(told, held(pages), df, n) > 0.5
    assert not asks(told)
    chat = page("[user] Caroline: Hey Mel, so glad to see you!\n[assistant] Melanie: Glad too! We adopted a puppy named Oscar.\n[user] Caroline: So cool, Mel!")
    assert novelty(chat, held(pages), df, n) >= MemoryIntake().novel  # judged turn by turn: Oscar the puppy is new


def test_an_answer_that_restates_memory_adds_nothing():
    pages, df, n = scope()
    restated = page("[user] What did Melanie paint?\n[assistant] Melanie painted a lake sunrise last year.")
    assert novelty(restated, held(pages), df, n) < MemoryIntake().novel
    assert not asks(restated)  # it states: someone answered
    assert novelty(restated, [], df, n) == 1.0  # against an empty scope every word is new


def test_only_a_user_turn_of_nothing_but_questions_asks():
    assert asks(page("[user] Where did we camp? And when was it?"))
    assert asks(page("[user] 我们在哪里露营？"))
    assert not asks(page("[user] We camped at the beach. When was it?"))
    assert not asks(page("[assistant] Where did we camp?"))
    assert not asks(page("[user] Where did we camp?\n[assistant] At the beach."))
    container = ConsolidatedPage(
        id="c", origin=Origin.STORAGE, depth=1, timestamp="", keywords=(), summary="Where?", source_ids=("a", "b"), content="", first_turn=-1, last_turn=-1
    )
    assert not asks(container)


def test_a_question_asked_again_in_other_words_repeats_the_first():
    pages, df, n = scope()
    first = page("[user] When did Caroline go to the LGBTQ support group?")
    again = page("[user] caroline, when did she go to the lgbtq support group?")
    other = page("[user] When did Melanie paint a sunrise?")
    assert repeats(again, [other, first], df, n) == first
    assert repeats(other, [first], df, n) is None
    stated = page("[user] Caroline went to the LGBTQ support group.")
    assert repeats(stated, [first], df, n) is None  # a statement is never a question's repeat


def test_pages_that_only_ask_never_outrank_pages_that_state_and_records_come_last():
    intent = anchor_intent("", "When did Caroline go to the LGBTQ support group?", now=None)
    question = Candidate(page("[user] When did Caroline go to the LGBTQ support group?"), lexical=9.0, dense=0.95)
    evidence = Candidate(page(SAID[0]), lexical=3.0, dense=0.5)
    weak = Candidate(page(SAID[3], first=3), lexical=0.2, dense=0.1)
    record = Candidate(page("[user] Caroline's support group, when?", first=9), lexical=12.0, dense=0.99, record=True)
    order = ranked(intent, [question, record, weak, evidence], None)
    assert order == [3, 2, 0, 1]


def test_a_record_is_never_given_to_a_request_but_a_page_that_asks_fills_what_is_left():
    intent = anchor_intent("", "support group", now=None)
    candidates = [
        Candidate(page(SAID[0]), lexical=1.0),
        Candidate(page("[user] Was the support group good?", first=5), lexical=3.0),
        Candidate(page("[user] support group", first=6), lexical=5.0, record=True),
    ]
    rules = selection(intent, candidates, None, COUNT, MemoryPolicy())
    try:
        while True:
            rules.send(None)
    except StopIteration as done:
        given = [p.content for p in done.value]
    assert given[0] == SAID[0] and "[user] Was the support group good?" in given and "[user] support group" not in given


def test_disuse_decays_a_page_and_consults_lift_it():
    policy = Metabolism(half_life_requests=100)
    assert decay(0, policy) == 0.0 and abs(decay(100, policy) - 0.5) < 1e-9 and decay(1000, policy) > 0.99
    assert rise(0) == 0.0 and rise(1) == 0.5 and rise(3) > rise(1)
    fresh = vitality(0.0, 0, 0, 0, policy)
    idle = vitality(0.0, 0, 300, 0, policy)
    opened = vitality(0.0, 0, 0, 2, policy)
    assert idle < fresh == 0.0 < opened
    assert idle >= -policy.fade_weight and opened <= policy.rise_weight
    # In the Router: two pages alike in every score, the one left idle sinks below the one consulted.
    intent = Intent(text="beans", weights={"beans": 1.0})
    alike = [
        Candidate(page("[user] beans in the garden", first=i), lexical=1.0, idle=idle_for, consulted=c) for i, (idle_for, c) in enumerate([(500, 0), (0, 1)])
    ]
    assert ranked(intent, alike, datetime(2024, 1, 1), MemoryPolicy(metabolism=policy, neighbour_share=0)) == [1, 0]


def test_a_requests_use_of_memory_is_what_it_was_given_shown_and_opened():
    given = [page(SAID[0]), page(SAID[1], first=1)]
    outcome = Outcome(
        kind="answer", text="", rounds=2, trace=[Step("Consult", given[1].id, "why"), Step("Expand", "x", "")], intent=Intent(text="q", weights={}),
        pages={given[0].id: PageState(Activation.HOT, 1.0, 0), given[1].id: PageState(Activation.INDEXED, 1.0, 0), "h1": PageState(Activation.SHELVED, 0.0, 3)},
    )  # fmt: skip
    use = memory_use(given, outcome)
    assert use.given == (given[0].id, given[1].id)
    assert set(use.shown) == {given[0].id, given[1].id}
    assert use.consulted == (given[1].id,)
    assert memory_use(given, None).shown == ()
