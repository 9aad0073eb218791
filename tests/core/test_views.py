from __future__ import annotations

import pytest

from pcp_core.pages.index import Activation, PageIndex, UnknownPage
from pcp_core.pages.logical import View
from pcp_core.pages.views import TRANSITIONS, Action, ViewState

from .helpers import cp, op, two_level_tree

S, D, U = View.SUMMARY, View.DETAIL, View.UNPACKED


@pytest.fixture
def tree():
    index, ids = two_level_tree()
    return ViewState(index), ids


def test_consult_climbs_summary_detail_unpacked_for_containers(tree):
    views, ids = tree
    views.consult(ids["A"])
    assert views.view(ids["A"]) == D
    views.consult(ids["A"])
    assert views.view(ids["A"]) == U
    views.consult(ids["A"])
    assert views.view(ids["A"]) == U


def test_original_pages_stop_at_detail(tree):
    views, ids = tree
    views.consult(ids["a1"])
    views.consult(ids["a1"])
    assert views.view(ids["a1"]) == D
    assert not any(to == U for (action, container, _), to in TRANSITIONS.items() if not container)


def test_consulting_a_hidden_page_unfolds_its_path(tree):
    views, ids = tree
    changes = views.consult(ids["b2"])
    assert views.view(ids["B"]) == U and views.view(ids["b2"]) == D
    assert [(c.page_id, c.before, c.after) for c in changes] == [(ids["B"], S, U), (ids["b2"], S, D)]


def test_shelve_steps_down(tree):
    views, ids = tree
    views.consult(ids["A"])
    views.consult(ids["A"])
    views.shelve(ids["A"])
    assert views.view(ids["A"]) == D
    views.shelve(ids["A"])
    assert views.view(ids["A"]) == S
    assert views.shelve(ids["A"]) == []  # already at the bottom: nothing changes


def test_shelving_the_last_raised_child_folds_the_container(tree):
    views, ids = tree
    views.consult(ids["a1"])
    views.consult(ids["a2"])
    views.shelve(ids["a1"])
    assert views.view(ids["A"]) == U  # a2 is still raised
    changes = views.shelve(ids["a2"])
    assert views.view(ids["A"]) == D
    assert (ids["A"], U, D) in [(c.page_id, c.before, c.after) for c in changes]


def test_active_zoom_folds_an_unpacked_container_nobody_looked_into(tree):
    views, ids = tree
    views.consult(ids["A"], round_no=0)
    views.consult(ids["A"], round_no=0)
    assert views.settle(0) == []  # unpacked this round: it gets the round to look inside
    assert views.view(ids["A"]) == U
    folded = views.settle(1)
    assert views.view(ids["A"]) == D and [c.page_id for c in folded] == [ids["A"]]


def test_active_zoom_keeps_a_container_with_a_raised_child(tree):
    views, ids = tree
    views.consult(ids["b1"], round_no=0)
    assert views.settle(3) == []
    assert views.view(ids["B"]) == U


def test_shelving_a_container_to_summary_hides_its_subtree(tree):
    views, ids = tree
    views.consult(ids["a1"])
    views.shelve(ids["A"])  # Unpacked -> Detail
    views.shelve(ids["A"])  # Detail -> Summary
    assert views.raised() == {}


def test_raise_to_detail_for_the_router(tree):
    views, ids = tree
    views.raise_to(ids["a2"], D)
    assert views.raised() == {ids["A"]: U, ids["a2"]: D}
    with pytest.raises(ValueError):
        views.raise_to(ids["a2"], U)


def test_unknown_ids_raise_unknown_page():
    views = ViewState(PageIndex())
    with pytest.raises(UnknownPage, match="nope"):
        views.consult("nope")


def test_every_transition_is_in_the_table():
    for action in Action:
        for container in (True, False):
            for view in (S, D) + ((U,) if container else ()):
                assert (action, container, view) in TRANSITIONS


def test_index_keeps_ids_unique_on_collision():
    index = PageIndex()
    first = index.register(op("one", 0))
    clash = op("two", 1)
    clash = type(clash)(**{**{f: getattr(clash, f) for f in clash.__struct_fields__}, "id": first.id})
    second = index.register(clash)
    assert second.id != first.id and len(index) == 2
    assert index.register(first) == first  # the same page again is not a new page


def registered(pages: list, topics: dict[str, str]) -> PageIndex:
    index = PageIndex()
    for page in pages:
        index.register(page, topics.get(page.id, ""))
    return index


def same_tree(a: PageIndex, b: PageIndex) -> bool:
    return (a.pages, a.parents, a.topics, a.roots, a.leaves()) == (b.pages, b.parents, b.topics, b.roots, b.leaves())


def test_a_tree_built_in_bulk_is_the_tree_registered_page_by_page():
    leaves = [op(f"page {i} text", i) for i in range(7)]
    low = [cp(leaves[0:2]), cp(leaves[2:5])]
    top = cp(low)
    pages = [*leaves, *low, top]  # leaves 5 and 6 stay roots beside the top container
    topics = {low[0].id: "T1", low[1].id: "T2"}
    bulk = PageIndex.of_tree(pages, topics)
    assert same_tree(bulk, registered(pages, topics))
    assert bulk.roots == [top.id, leaves[5].id, leaves[6].id] and bulk.parent(leaves[3].id) == low[1].id
    assert bulk.topic(low[1].id) == "T2" and bulk.topic(top.id) == ""
    # Two pages with one id: the second gets a longer one, as registering gives it.
    clash = type(leaves[6])(**{**{f: getattr(leaves[6], f) for f in leaves[6].__struct_fields__}, "id": leaves[5].id})
    colliding = [*leaves[:6], clash]
    bulk = PageIndex.of_tree(colliding, {})
    assert same_tree(bulk, registered(colliding, {})) and len(bulk) == 7


def test_state_is_kept_for_touched_pages_only(tree):
    views, ids = tree
    index = views.index
    index.touch(ids["a1"])
    index.tick()
    index.activate(ids["b1"], Activation.HOT)
    assert index.heat == {ids["a1"]: 0.5} and index.staleness(ids["a1"]) == 1 and index.staleness(ids["a2"]) == 1
    assert index.activation(ids["b1"]) == Activation.HOT and index.activation(ids["b2"]) == Activation.INDEXED
    with pytest.raises(UnknownPage):
        index.touch("nope")


def test_injected_pages_leave_their_path_folded(tree):
    views, ids = tree
    views.raise_to(ids["b1"], D, unfold=False)
    assert views.raised() == {ids["b1"]: D}


def test_raised_pages_are_listed_in_the_order_their_views_last_changed():
    index, ids = two_level_tree()
    views = ViewState(index)
    views.raise_to(ids["b1"], View.DETAIL, unfold=False)
    views.raise_to(ids["a1"], View.DETAIL, unfold=False)
    views.raise_to(ids["b1"], View.DETAIL, unfold=False)  # no change: it keeps its place
    assert list(views.raised()) == [ids["b1"], ids["a1"]]
    views.consult(ids["B"])  # Summary -> Detail: new, last
    views.consult(ids["B"])  # Detail -> Unpacked: changed again, still last
    views.shelve(ids["a1"])
    views.raise_to(ids["a1"], View.DETAIL, unfold=False)  # back after a Shelve: new again
    assert list(views.raised()) == [ids["b1"], ids["B"], ids["a1"]]
