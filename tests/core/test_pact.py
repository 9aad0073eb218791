"""PACT's rules without a server: coordinates, selectors, ODI, TTL, cadence, forks, where components render."""

from __future__ import annotations

import pytest

from pcp_core.pact.placement import onto_messages, onto_pages, placement
from pcp_core.pact.tree import ComponentSpec, PactError, Tree, delete, insert, on_request, parse_coordinates, parse_selector, select, snapshot
from pcp_core.paging.history import page_history, turns_from_messages
from pcp_core.session import chain_links

from .counting import COUNT


def chat(n: int, edit: int | None = None) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}" + (" (edited)" if i == edit else "")} for i in range(n)]


def links(n: int, edit: int | None = None) -> list[str]:
    return chain_links(chat(n, edit))


def spec(at: str, content: str = "note", **fields) -> ComponentSpec:
    return ComponentSpec(at=at, content=content, **fields)


def request(tree: Tree, n: int, *inline: ComponentSpec, edit: int | None = None) -> Tree:
    return on_request(tree, links(n, edit), inline, now_ns=1)


def where(tree: Tree) -> dict[str, str]:
    """Each component's content → its coordinates."""
    return {c.content: f"d{c.depth},{c.position},{c.offset}" for c in tree.components}


def rendered(tree: Tree) -> dict[int, list[str]]:
    """What renders in the tree's turn: message place → contents (-1: system level)."""
    placed = placement(tree)
    return {**({-1: [c.content for c in placed.system]} if placed.system else {}), **{i: [c.content for c in cs] for i, cs in placed.messages.items()}}


# -- coordinates and selectors ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected", [("d0,1,0", (0, 1, 0)), ("d0, 1, 0", (0, 1, 0)), ("(1, 1, -2)", (1, 1, -2)), ("d-1,1,0", (-1, 1, 0)), ("D3,0,+1", (3, 0, 1))]
)
def test_coordinates_read_as_pact_writes_them(text, expected):
    assert tuple(parse_coordinates(text)) == expected
    assert str(parse_coordinates(text)) == "d{},{},{}".format(*expected)


@pytest.mark.parametrize(
    "text, says",
    [
        ("d0,1", "three fields"),
        ("d0,x,0", "the position must be a whole number, not 'x'"),
        ("dq,1,0", "the depth must be a whole number, not 'q'"),
        ("d-2,1,0", "depth must be -1"),
        ("d0,0,0", "the message itself"),
        ("d1,1,0.5", "the offset must be a whole number"),
    ],
)
def test_bad_coordinates_say_where(text, says):
    with pytest.raises(PactError, match=says.replace("(", r"\(")):
        parse_coordinates(text)


def test_selectors_take_numbers_ranges_and_stars():
    tree = Tree(count=8, chain=links(8))
    for at, content in [("d-1,1,0", "sys"), ("d0,1,0", "now"), ("d2,1,-2", "before"), ("d2,2,0", "second"), ("d3,1,1", "three"), ("d7,1,0", "first")]:
        tree, _ = insert(tree, spec(at, content, key=content, tags=["odd"] if content in ("now", "three") else []), now_ns=1)
    chosen = lambda text: [c.content for c in select(tree, parse_selector(text))]  # noqa: E731
    assert chosen("d1-3,1,*") == ["three", "before"]  # render order: the older message first
    assert chosen("d*,*,*") == ["sys", "first", "three", "before", "second", "now"]
    assert chosen("d*,*,-2--1") == chosen("d*,*,-2..-1") == ["before"]
    assert chosen("d-1,*,*") == ["sys"]
    assert chosen("d2,2,0") == ["second"]
    assert chosen("#three") == ["three"] and chosen("+odd") == ["three", "now"]


@pytest.mark.parametrize(
    "text, says", [("d3-1,1,*", "runs backwards"), ("d1-x,1,*", "the depth must be a number, a range"), ("d1,1", "three fields"), ("d1,**,0", "the position")]
)
def test_bad_selectors_say_where(text, says):
    with pytest.raises(PactError, match=says):
        parse_selector(text)


# -- ODI, TTL, cadence -------------------------------------------------------------------------


def test_odi_moves_permanent_and_sticky_components_with_their_message():
    tree = request(Tree(), 1, spec("d0,1,-2", "permanent"), spec("d0,2,0", "sticky", ttl=1, cadence=1), spec("d-1,1,0", "system"))
    assert where(tree) == {"permanent": "d0,1,-2", "sticky": "d0,2,0", "system": "d-1,1,0"}
    for n in (3, 5, 9):  # the conversation grows by a reply and a question, then by four
        tree = request(tree, n)
        assert where(tree) == {"permanent": f"d{n - 1},1,-2", "sticky": f"d{n - 1},2,0", "system": "d-1,1,0"}
        assert rendered(tree) == {-1: ["system"], 0: ["permanent", "sticky"]}
    assert tree.turn == 4


def test_a_retry_is_not_a_turn():
    tree = request(Tree(), 3, spec("d0,1,0", "reminder", ttl=1))
    assert request(tree, 3) == tree
    assert rendered(request(tree, 3)) == {2: ["reminder"]}
    assert rendered(request(tree, 5)) == {}


def test_a_retry_does_not_attach_its_components_twice():
    tree = request(Tree(), 3, spec("d0,1,0", "typed on a phone"))
    assert request(tree, 3, spec("d0,1,0", "typed on a phone")) == tree
    again = request(request(tree, 5), 5, spec("d0,1,0", "typed on a phone"))  # a new turn: a new component, on message 4
    assert [(c.content, c.depth) for c in select(again)] == [("typed on a phone", 2), ("typed on a phone", 0)]


def test_ttl_counts_turns_and_a_temporary_component_keeps_its_depth():
    tree = request(Tree(), 1, spec("d0,1,0", "for two turns", ttl=2))
    assert rendered(tree) == {0: ["for two turns"]}
    tree = request(tree, 3)
    assert where(tree) == {"for two turns": "d0,1,0"}  # not moved: beside the new current message
    assert rendered(tree) == {2: ["for two turns"]}
    tree = request(tree, 5)
    assert tree.components == [] and rendered(tree) == {}


def test_a_component_attached_between_requests_lives_from_the_next_one():
    tree = request(Tree(), 1)
    tree, _ = insert(tree, spec("d0,1,0", "once", ttl=1), now_ns=2)
    assert tree.components[0].born is None
    tree = request(tree, 3)
    assert rendered(tree) == {2: ["once"]}
    assert request(tree, 5).components == []


def test_cadence_brings_a_component_back_every_n_turns():
    tree = request(Tree(), 1, spec("d0,1,0", "check in", cadence=3), spec("d-1,1,0", "twice, every four", ttl=2, cadence=4))
    seen = []
    for n in range(1, 20, 2):
        tree = request(tree, n) if n > 1 else tree
        seen.append(rendered(tree))
    assert [i for i, r in enumerate(seen, 1) if "check in" in r.get(i * 2 - 2, [])] == [1, 4, 7, 10]
    assert [i for i, r in enumerate(seen, 1) if r.get(-1)] == [1, 2, 5, 6, 9, 10]
    assert where(tree)["check in"] == "d0,1,0"  # cyclic: it stays at its depth


def test_a_fork_keeps_the_components_of_the_shared_messages_only():
    tree = request(Tree(), 1, spec("d0,1,0", "on 0"))
    tree = request(tree, 3, spec("d0,1,0", "on 2"), spec("d1,1,0", "on 1, for a while", ttl=5), spec("d-1,1,0", "system"))
    edited = request(tree, 4, edit=2)  # message 2 rewritten, one more after it
    assert where(edited) == {"on 0": "d3,1,0", "on 1, for a while": "d1,1,0", "system": "d-1,1,0"}
    cut = request(tree, 2)  # cut back to two messages: message 2 is gone
    assert where(cut) == {"on 0": "d1,1,0", "on 1, for a while": "d1,1,0", "system": "d-1,1,0"}
    assert rendered(cut) == {-1: ["system"], 0: ["on 0", "on 1, for a while"]}


def test_a_key_names_one_component_and_deletes_it():
    tree = request(Tree(), 3, spec("d0,1,0", "old", key="city"))
    tree, added = insert(tree, spec("d2,1,0", "new", key="city"), now_ns=3)
    assert where(tree) == {"new": "d2,1,0"} and added.creation_index == 1
    tree, gone = delete(tree, "city")
    assert gone is added and tree.components == []
    assert delete(tree, "city") == (tree, None)


def test_depths_beyond_the_conversation_are_refused_once_it_is_known():
    with pytest.raises(PactError, match="holds 3 messages, d0 to d2"):
        request(Tree(), 3, spec("d3,1,0"))
    with pytest.raises(PactError, match="no messages yet"):
        request(Tree(), 0, spec("d0,1,0"))
    tree, _ = insert(Tree(), spec("d0,1,0", "before any request"), now_ns=1)  # counted from the next request
    assert rendered(request(tree, 3)) == {2: ["before any request"]}


# -- where components render --------------------------------------------------------------------


def test_components_render_beside_their_message_and_at_system_level():
    tree = request(Tree(), 3, spec("d2,1,-1", "before"), spec("d2,1,0", "after"), spec("d0,1,0", "now"), spec("d-1,1,0", "system"))
    messages = [{"role": "system", "content": "Be kind."}, *chat(2), {"role": "user", "content": [{"type": "text", "text": "parts"}]}]
    out = onto_messages(messages, placement(tree))
    assert [m["content"] for m in out] == [
        "Be kind.\n\nsystem",
        "before\n\nmessage 0\n\nafter",
        "message 1",
        [{"type": "text", "text": "parts"}, {"type": "text", "text": "now"}],
    ]
    assert messages[1]["content"] == "message 0"  # the client's messages are not changed
    bare = onto_messages(chat(3), placement(tree))
    assert bare[0] == {"role": "system", "content": "system"} and len(bare) == 4
    tool_call = onto_messages([{"role": "assistant", "content": None, "tool_calls": []}], placement(request(Tree(), 1, spec("d0,1,0", "x"))))
    assert tool_call[0]["content"] == "x"


def test_in_protocol_mode_a_component_rides_in_its_messages_page():
    messages = chat(12)
    pages = page_history(turns_from_messages(messages, "2026-01-01T00:00:00"), COUNT)
    tree = request(Tree(), 13, spec("d7,1,0", "about message 5"), spec("d0,1,0", "about the query"))
    placed, n = onto_pages(pages, placement(tree), history=12)
    assert n == 1
    [leaf] = [p for p in placed.leaves if "about message 5" in p.content]
    assert leaf.first_turn < 5 < leaf.last_turn and leaf.id == pages.leaves[placed.leaves.index(leaf)].id
    assert leaf.content.endswith("\n[component] about message 5")
    assert sum("[component]" in p.content for p in placed.leaves) == 1


def test_the_snapshot_holds_regions_and_message_containers():
    tree = request(Tree(), 3, spec("d2,1,0", "old"), spec("d0,1,0", "new"), spec("d-1,1,0", "sys"))
    tree, _ = insert(tree, spec("d0,1,0", "pending", ttl=2), now_ns=2)
    shot = snapshot(tree, "s")
    sys_, seq, ah = shot["root"]["children"]
    assert [n["content"] for n in sys_["children"]] == ["sys"]
    assert [(m["coordinates"], [n["content"] for n in m["children"]]) for m in seq["children"]] == [("d2,0,0", ["old"])]
    assert [n["content"] for m in ah["children"] for n in m["children"]] == ["new", "pending"]
    assert seq["children"][0]["id"] == "m:" + links(3)[0][:16]
    assert shot["messages"] == 3 and shot["turn"] == 1 and shot["pending"] == []
