"""Rules that bound what the own API keeps: ids matched whole, coordinates within 64 bits, a scope's core within the budget share, imported blocks held to a round's rules."""

from __future__ import annotations

import pytest

from pcp_core import SESSION_ID
from pcp_core.hybrid import Block, LimitsPolicy, block_problems, within_room
from pcp_core.pact.tree import PactError, parse_coordinates, parse_selector
from tests.core.counting import COUNT


def block(bid: str, content: str = "the user likes tea", **fields) -> Block:
    return Block(**{"id": bid, "type": "fact", "decay": 0.1, "confidence": 0.9, "round": 1, "tags": ("t",), "content": content, **fields})


@pytest.mark.parametrize("name", ["alice\n", "alice\r\n", "\nalice", "al ice", "", "a" * 129])
def test_an_id_is_matched_whole(name):
    assert SESSION_ID.fullmatch(name) is None and SESSION_ID.match(name) is None


@pytest.mark.parametrize("text", [f"d{10**23},1,0", f"d-1,1,{-(10**21)}", f"d-1,{2**62 + 1},0", "d" + "9" * 5000 + ",1,0"])
def test_coordinates_past_their_range_are_refused(text):
    with pytest.raises(PactError, match="between -2\\^62 and 2\\^62"):
        parse_coordinates(text)


def test_coordinates_at_the_edge_are_kept():
    assert tuple(parse_coordinates(f"d{2**62},1,{-(2**62)}")) == (2**62, 1, -(2**62))


@pytest.mark.parametrize("text", ["d" + "9" * 5000 + ",*,*", f"d0-{2**64},*,*", f"*,*,{-(2**63)}"])
def test_selectors_past_their_range_are_refused(text):
    with pytest.raises(PactError):
        parse_selector(text)


def test_a_scopes_core_is_shown_best_first_within_the_room():
    strong, weak = block("a", confidence=1.0), block("b", confidence=0.5)
    huge = block("c", content="word " * 50_000, confidence=1.0, decay=0.0)
    room = 2 * COUNT('{"id":"a","type":"fact","decay":0.1,"confidence":1.0,"round":1,"tags":["t"],"content":"the user likes tea"}')
    counted: list[int] = []

    def count(text: str) -> int:
        counted.append(len(text))
        return COUNT(text)

    assert [b.id for b in within_room([weak, huge, strong], room, count)] == ["a", "b"]
    assert max(counted) < 1000  # the block that cannot fit is never counted
    assert within_room([strong, weak], room // 2, COUNT) == (strong,)
    assert within_room([strong], 0, COUNT) == ()


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"decay": 5.0}, "decay 5.0 is outside [0, 1]"),
        ({"confidence": -3.0}, "confidence -3.0 is outside [0, 1]"),
        ({"decay": 0.95}, "low quality"),
        ({"round": -1}, "before the first round"),
        ({"content_state": "tag_ref", "tag_id": "x"}, "placeholder"),
    ],
)
def test_an_imported_block_is_held_to_a_rounds_rules(fields, problem):
    assert any(problem in p for p in block_problems(block("x", **fields), LimitsPolicy()))


def test_a_good_block_has_no_problem_whatever_its_round():
    assert block_problems(block("x", round=10**6)) == []
