"""The Router: broad match (BM25 with feedback, dense recall) and precision selection by a model."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

import numpy as np
import pytest

from pcp_core.ranking.bm25 import Bm25, Bm25Cache
from pcp_core.ranking.router import anchor_intent, dated_in, dense_scores, dense_texts, page_ranking, precision_selection, router_prompt, unit_texts
from pcp_core.text.tokens import prompt_tokens

from .counting import COUNT
from .helpers import op

PAGES = [
    op("Caroline went to a transgender support group and felt accepted.", 0),
    op("Caroline talked about her transition and the support group again.", 1),
    op("Her transition journey made her braver as a transgender woman.", 2),
    op("Melanie painted a sunrise over the lake last year.", 3),
    op("Melanie ran a charity race for mental health.", 4),
    op("They discussed the weather and the garden.", 5),
]


def ids(ranked):
    return [page_id for page_id, _ in ranked]


def test_bm25_ranks_the_pages_that_share_the_query_words():
    ranked = ids(Bm25(PAGES).rank(anchor_intent("", "Where did Caroline go for support?").weights))
    assert set(ranked[:2]) == {PAGES[0].id, PAGES[1].id}
    assert PAGES[5].id not in ranked


def test_feedback_reaches_a_page_in_the_evidence_words_not_the_questions():
    search, query = Bm25(PAGES), anchor_intent("", "What support group did Caroline attend?").weights
    plain, expanded = ids(search.rank(query)), ids(search.rank_with_feedback(query, pages=2, terms=8))
    # Page 2 shares no word with the question; "transition" and "transgender" with its best pages.
    assert PAGES[2].id not in plain and PAGES[2].id in expanded
    assert set(expanded[:2]) == set(plain[:2])  # the query's own words still lead
    assert PAGES[5].id not in expanded


# -- dense recall ------------------------------------------------------------------------


def test_pages_are_the_units_and_each_is_read_alone_and_with_the_one_before():
    first = op("[user] Did you ever visit Oslo?\n[assistant] Yes, last May!", 0)
    second = op("[user] How was the weather?", 1)
    units = unit_texts([first, second])
    assert units == ["Did you ever visit Oslo?\nYes, last May!", "How was the weather?"]
    assert dense_texts(units) == [*units, units[0], "Did you ever visit Oslo?\nYes, last May!\nHow was the weather?"]


def test_a_page_beside_a_strong_match_outranks_a_lone_one_that_scores_a_little_more():
    ids = ["lone", "filler", "beside", "strong"]
    lexical = [5.5, 0.0, 5.0, 9.0]
    # Without neighbours the filler, which shares no term, is not ranked at all.
    assert page_ranking(ids, lexical, neighbour_share=0.0) == ["strong", "lone", "beside"]
    assert page_ranking(ids, lexical) == ["strong", "beside", "lone", "filler"]


def test_equal_scores_keep_conversation_order():
    assert page_ranking(["a", "b", "c", "d"], [1.0, 2.0, 1.0, 2.0], neighbour_share=0.0) == ["b", "d", "a", "c"]


def test_dense_scores_take_the_better_reading_of_each_page():
    # The intent's cosines with two pages read alone, then the same two read with the page before.
    scores = dense_scores([0.0, 0.6, 0.0, 0.0], 2)
    assert scores[1] > scores[0]  # only page 1 alone points where the intent does
    assert dense_scores([0.0, 0.0, 0.0, 0.6], 2)[1] > 0  # or page 1 read after page 0


def test_dense_recall_lifts_a_page_that_shares_no_word_with_the_query():
    owners = ["dog", "weather", "garden"]
    lexical = [0.0, 0.0, 2.0]  # the garden page shares a word; the dog page says "puppy"
    dense = np.array([3.0, -1.0, -1.0])  # already on the z scale, as dense_scores gives it
    assert page_ranking(owners, lexical)[0] == "garden"
    assert page_ranking(owners, lexical, dense)[0] == "dog"


def test_the_lexical_scores_of_texts_follow_their_order():
    turns = ["We adopted a greyhound named Biscuit.", "The weather was grey.", "Biscuit loves the beach."]
    scores = Bm25.of_texts(turns).feedback_scores(anchor_intent("", "What is the greyhound called?").weights)
    assert len(scores) == 3 and scores[0] == max(scores) and scores[0] > 0


class Read(Bm25Cache):
    """The cache, noting the texts an index reads the terms of."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []

    def terms(self, text: str) -> Any:
        self.read.append(text)
        return super().terms(text)


@pytest.mark.parametrize(
    ("earlier", "shared"),
    [(lambda turns: turns[:41], 41), (lambda turns: [*turns[:40], "the greyhound on the beach, as the page stood"], 40)],
    ids=["a prefix of them", "the last page before it was reopened"],
)
def test_an_index_extended_from_an_earlier_requests_scores_as_one_built_whole(earlier, shared):
    rng = random.Random(7)
    words = "greyhound biscuit beach garden roof invoice lisbon concert puppy weather budget river".split()
    turns = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(60)]
    query = anchor_intent("", "Where did the greyhound run on the beach?").weights
    whole = Bm25.of_texts(turns, Bm25Cache()).feedback_scores(query)

    cache = Read()
    Bm25.of_texts(earlier(turns), cache)  # an earlier request of the conversation
    cache.read.clear()
    extended = Bm25.of_texts(turns, cache)
    assert cache.read == turns[shared:]  # the texts after what the two share: not built from nothing
    assert extended.n == 60 and extended.ids == [str(i) for i in range(60)]
    np.testing.assert_allclose(extended.feedback_scores(query), whole)


def test_the_cache_of_terms_is_bounded_and_keeps_the_newer_half():
    cache = Bm25Cache(texts=10, indexes=2)
    texts = [f"text number {i} about greyhound {i}" for i in range(25)]
    for text in texts:
        cache.terms(text)
    assert len(cache) <= 10
    kept = cache.terms(texts[-1])
    assert kept is cache.terms(texts[-1])  # held: the same arrays, not computed again
    assert "greyhound" in kept.terms
    for n in range(3):  # three conversations: the newer two kept
        Bm25.of_texts([f"conversation {n} turn {i} about {texts[i]}" for i in range(4)], cache)
    assert len(cache.recent()) == 2


def test_the_texts_terms_take_at_most_half_the_bytes_and_the_indexes_what_the_terms_leave():
    conversations = [[f"conversation {c} turn {i} about the greyhound {i * c} and the beach" for i in range(200)] for c in range(6)]
    bound = 3 * Bm25.of_texts(conversations[0]).resident_bytes
    cache = Bm25Cache(max_bytes=bound)
    for turns in conversations:
        Bm25.of_texts(turns, cache)
        assert cache.terms_bytes <= bound // 2 + 2_000  # (the text that went over it)
        assert cache.resident_bytes <= bound or len(cache.recent()) == 1
    assert 0 < len(cache) < 6 * 200  # the older texts' terms dropped
    kept = cache.terms(conversations[-1][-1])
    assert kept is cache.terms(conversations[-1][-1])


def test_a_conversation_keeps_one_index_however_many_follow_ups_extend_it():
    cache = Bm25Cache()
    turns = [f"turn {i} about the greyhound and the beach {i}" for i in range(40)]
    for n in range(10, 41, 10):  # follow-ups
        latest = Bm25.of_texts(turns[:n], cache)
    assert cache.recent() == [latest]
    forked = Bm25.of_texts([*turns[:20], "an edited turn about the roof"], cache)  # a branch of its own
    assert cache.recent() == [latest, forked]


def test_the_indexes_kept_are_bounded_by_bytes_the_newest_always_kept():
    conversations = [[f"conversation {c} turn {i} about the greyhound {i * c}" for i in range(50)] for c in range(4)]
    one = Bm25.of_texts(conversations[0]).resident_bytes
    cache = Bm25Cache(texts=0, max_bytes=int(2.5 * one))  # (no texts' terms kept: the indexes alone)
    for turns in conversations:
        Bm25.of_texts(turns, cache)
    assert len(cache.recent()) == 2 and cache.resident_bytes <= 2.5 * one
    alone = Bm25Cache(max_bytes=1)
    newest = Bm25.of_texts(conversations[0], alone)
    assert alone.recent() == [newest]


# -- the Timeline in addressing ------------------------------------------------------------

NOW = datetime(2026, 11, 23)


def test_the_intent_holds_the_times_the_query_names_once_it_knows_now():
    assert anchor_intent("", "Where did we camp in July 2023?").periods == ()
    (july,) = anchor_intent("", "Where did we camp in July 2023?", now=NOW).periods
    assert (july.start, july.end) == (datetime(2023, 7, 1), datetime(2023, 8, 1))
    assert anchor_intent("On 8 May, 2023 we met", "Where did we camp?", now=NOW).periods == ()  # the tail names times, not the head


def test_pages_dated_in_the_period_or_told_of_soon_after_are_timely():
    (july,) = anchor_intent("", "Where did we camp in July 2023?", now=NOW).periods
    stamps = ["2023-06-30T23:59:00", "2023-07-01T00:00:00", "2023-07-31T12:00:00Z", "2023-08-10T09:00:00", "2023-08-20T09:00:00", "not a time"]
    assert dated_in(stamps, [july]).tolist() == [False, True, True, True, False, False]
    assert dated_in(stamps, []) is None
    assert dated_in(["2022-01-01T00:00:00"], [july]) is None  # nothing was said then: time tells nothing apart


def test_a_timely_page_leads_among_equals_and_ranks_without_a_shared_word():
    owners = ["may", "july", "silent-july", "june"]
    lexical = [3.0, 3.0, 0.0, 3.0]
    timely = np.array([False, True, True, False])
    plain = page_ranking(owners, lexical, neighbour_share=0.0)
    assert plain[0] == "may" and "silent-july" not in plain
    dated = page_ranking(owners, lexical, timely=timely, neighbour_share=0.0)
    assert dated[0] == "july" and "silent-july" in dated
    # The lift is one standard deviation: a far stronger match from another time still wins.
    assert (
        page_ranking(
            ["may", "july", "a", "b", "c", "d"],
            [40.0, 3.0, 1.0, 1.0, 1.0, 1.0],
            timely=np.array([False, True, False, False, False, False]),
            neighbour_share=0.0,
        )[0]
        == "may"
    )


# -- precision selection by a router model ----------------------------------------------


def test_the_router_models_choice_leads_and_the_rest_keeps_its_order():
    ranked = ["a1", "b2", "c3", "d4", "e5"]
    reply = "c3, zz99, a1. (e5 is off the list)"  # e5 is no candidate; zz99 is no page
    assert precision_selection(ranked, reply, candidates=ranked[:4]) == ["c3", "a1", "b2", "d4", "e5"]


def test_a_router_reply_without_ids_changes_nothing():
    ranked = ["a1", "b2", "c3"]
    assert precision_selection(ranked, "I cannot tell.", candidates=ranked) == ranked


def test_the_router_prompt_keeps_the_best_candidates_that_fit_the_budget():
    intent = anchor_intent("", "Where did Caroline go for support?")
    whole = router_prompt(intent, PAGES, budget=4096, count=COUNT)
    assert all(f"[{page.id}]" in whole[1]["content"] for page in PAGES)
    tight_budget = prompt_tokens(whole, COUNT) - 10
    tight = router_prompt(intent, PAGES, budget=tight_budget, count=COUNT)
    assert prompt_tokens(tight, COUNT) <= tight_budget
    assert f"[{PAGES[0].id}]" in tight[1]["content"] and f"[{PAGES[-1].id}]" not in tight[1]["content"]
