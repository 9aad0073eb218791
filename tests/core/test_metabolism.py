"""Metabolism (§VI.5): Topic IDs, horizontal merge of stale same-topic groups, vertical branching."""

from __future__ import annotations

from pcp_core.pages.logical import ConsolidatedPage, tree_depths
from pcp_core.pages.topics import MetabolismPolicy, assign_topics, branches, horizontal_merge
from pcp_core.paging.history import PagedHistory, PagingPolicy, page_history, turns_from_messages
from pcp_core.text.terms import TermStats

from .counting import COUNT
from .helpers import op

TOPICS = {
    "boiler": "the boiler in the basement leaks again; the plumber checked the pressure valve, the thermostat and the radiator pipes",
    "garden": "we planted tomatoes, basil and courgettes in the raised beds; the compost and the watering hose need fixing",
    "lisbon": "our trip to Lisbon: the tram to Alfama, pastel de nata in Belem, fado at night and the Tagus ferry",
    "piano": "my piano lessons: scales, a Chopin nocturne, the metronome at sixty and the recital next spring",
    "taxes": "the tax return: receipts, the accountant, deductions for the home office and the filing deadline",
    "wedding": "my cousin's wedding: the venue by the lake, the caterer, the seating plan and the band",
}
# Sessions in time order; the boiler comes back after four other topics.
SESSIONS = ["boiler", "garden", "lisbon", "piano", "boiler", "taxes", "wedding", "garden", "piano"]


def conversation(sessions=SESSIONS, turns_per_session: int = 10) -> list[dict]:
    messages = []
    for day, topic in enumerate(sessions, start=1):
        for i in range(turns_per_session):
            header = f"[2024-03-{day:02d} 10:00]\n" if i == 0 else ""
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"{header}About {TOPICS[topic]} (note {day}.{i})."})
    return messages


POLICY = PagingPolicy(max_roots=3, metabolism=MetabolismPolicy(near_field=2))


def paged(messages, known=None, reused=0) -> PagedHistory:
    return page_history(turns_from_messages(messages, "2024-03-01T00:00:00"), COUNT, POLICY, known, reused)


def first_level(history: PagedHistory) -> list[ConsolidatedPage]:
    return [c for c in history.containers if c.id in history.topics]


def words_of(history: PagedHistory, container: ConsolidatedPage) -> str:
    leaves = {leaf.id: leaf for leaf in history.leaves}
    index = history.index()
    return " ".join(leaves[p.id].content for p in index.leaves([container.id]))


# -- the rules, one at a time ---------------------------------------------------------------


def test_a_group_takes_the_topic_of_the_earlier_group_it_is_most_like():
    stats = TermStats(["boiler valve pipes", "tomatoes basil compost", "boiler valve thermostat", "piano scales"])
    signatures = [("boiler", "valve", "pipes"), ("tomatoes", "basil", "compost"), ("boiler", "valve", "thermostat"), ("piano", "scales")]
    topics = assign_topics(signatures, [None] * 4, ["a", "b", "c", "d"], stats, MetabolismPolicy())
    assert topics == ["Ta", "Tb", "Ta", "Td"]


def test_a_topic_decided_before_is_kept():
    stats = TermStats(["boiler valve", "boiler valve"])
    topics = assign_topics([("boiler", "valve"), ("boiler", "valve")], [None, "Tz"], ["a", "b"], stats, MetabolismPolicy())
    assert topics == ["Ta", "Tz"]
    # A new group that says nothing distinctive (an empty signature) starts a topic of its own.
    assert assign_topics([("boiler", "valve"), ()], ["Tz", None], ["a", "b"], stats, MetabolismPolicy()) == ["Tz", "Tb"]


def test_horizontal_merge_joins_adjacent_far_field_groups_of_one_topic_only():
    pages = [op(f"page {i}", i) for i in range(9)]
    groups = [pages[0:2], pages[2:4], pages[4:5], pages[5:7], pages[7:9]]
    topics = ["A", "A", "B", "B", "B"]
    merged, kept = horizontal_merge(groups, topics, MetabolismPolicy(near_field=2, merge_max=10))
    # A+A merge; B's first far-field group stays apart from the near field's B groups.
    assert merged == [pages[0:4], pages[4:5], pages[5:7], pages[7:9]]
    assert kept == ["A", "B", "B", "B"]
    capped, _ = horizontal_merge(groups, topics, MetabolismPolicy(near_field=2, merge_max=3))
    assert capped[0] == pages[0:2]  # 4 pages would pass merge_max


def test_a_branch_gathers_a_revisited_topic_and_the_near_field_stays_apart():
    pages = [op(f"page {i}", i) for i in range(6)]
    topics = {p.id: t for p, t in zip(pages, ["A", "B", "A", "C", "A", "A"])}
    units = branches(pages, topics, MetabolismPolicy(near_field=2))
    assert units == [[pages[0], pages[2]], [pages[1]], [pages[3]], [pages[4]], [pages[5]]]


# -- through paging ------------------------------------------------------------------------


def test_a_revisited_topic_gets_one_branch_over_its_groups():
    history = paged(conversation())
    groups = first_level(history)
    boiler = [g for g in groups if "boiler" in words_of(history, g)]
    assert len(boiler) == 2 and len({history.topics[g.id] for g in boiler}) == 1
    others = {history.topics[g.id] for g in groups if "boiler" not in words_of(history, g)}
    assert history.topics[boiler[0].id] not in others

    branch = [c for c in history.containers if set(c.source_ids) == {g.id for g in boiler}]
    assert len(branch) == 1
    assert branch[0].first_turn == boiler[0].first_turn and branch[0].last_turn == boiler[1].last_turn

    index = history.index()
    assert index.topic(boiler[0].id) == history.topics[boiler[0].id]
    # The tree stays a tree: every child one level below its container, leaves in time order.
    for page in index:
        if isinstance(page, ConsolidatedPage):
            assert {index.get(c).depth for c in page.source_ids} == {page.depth + 1}
    assert [p.first_turn for p in index.leaves()] == sorted(p.first_turn for p in index.leaves())
    assert len(index.roots) <= POLICY.max_roots


def test_a_growing_conversation_keeps_its_far_field_tree():
    messages = conversation()
    before = paged(messages)
    grown = [*messages, *conversation(["lisbon", "taxes"])]
    after = paged(grown, before, reused=len(messages))
    far = first_level(before)[: -POLICY.metabolism.near_field - 1]
    kept = {c.id: c for c in after.containers}
    for group in far:
        assert group.id in kept and after.topics[group.id] == before.topics[group.id]
    # The new Lisbon session continues the old Lisbon topic.
    lisbon = [g for g in first_level(after) if "Lisbon" in words_of(after, g)]
    assert len(lisbon) == 2 and len({after.topics[g.id] for g in lisbon}) == 1


def test_same_topic_groups_that_leave_the_near_field_are_merged():
    # Two sessions on the boiler in a row: cut by their dated headers, one topic.
    messages = conversation(["boiler", "boiler", "garden", "lisbon", "piano"], turns_per_session=6)
    history = paged(messages)
    boiler = [g for g in first_level(history) if "boiler" in words_of(history, g)]
    assert len(boiler) == 1 and "note 1." in words_of(history, boiler[0]) and "note 2." in words_of(history, boiler[0])


def test_every_page_is_at_its_depth_as_the_conversation_grows_and_is_edited():
    # Follow-ups reuse most of the tree; as it grows, the backbone gains levels and every depth moves.
    messages = conversation(["boiler", "garden"], turns_per_session=6)
    history = paged(messages)
    levels = set()
    for step, topic in enumerate(["lisbon", "piano", "boiler", "taxes", "wedding", "garden", "piano", "lisbon", "taxes"]):
        grown = [*messages, *conversation([topic], turns_per_session=6)]
        if step % 3 == 2:  # an edit: the last two messages said otherwise
            grown = [*messages[:-2], {"role": "user", "content": f"Edited {step}."}, *grown[len(messages) :]]
            history = paged(grown, history, reused=len(messages) - 2)
        else:
            history = paged(grown, history, reused=len(messages))
        messages = grown
        pages = [*history.leaves, *history.containers]
        depths = tree_depths(pages)
        assert {page.id: page.depth for page in pages} == depths
        levels.add(max(depths.values()))
    assert len(levels) >= 2
