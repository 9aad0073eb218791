"""Cutting a text to a number of tokens."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pcp_core.text.tokens import leading_tokens
from tests.core.counting import COUNT

PIECES = st.lists(st.sampled_from(["a", "bc", " ", "  ", "\n", "ü", "ok. ", "x" * 20, "Fix the parser. "]), max_size=60).map("".join)


@given(PIECES, st.integers(0, 40))
def test_the_opening_starts_the_text_fits_and_takes_nearly_all_the_room(text, tokens):
    opening = leading_tokens(text, tokens, COUNT)
    assert text.startswith(opening) and COUNT(opening) <= tokens
    assert opening == text or COUNT(opening) >= tokens - 2  # a token may straddle where it is cut


def test_a_text_far_longer_than_its_share_is_counted_only_near_its_start():
    counted: list[int] = []

    def count(text: str) -> int:
        counted.append(len(text))
        return COUNT(text)

    pasted = "def f(x):\n    return x + 1\n" * 40_000
    opening = leading_tokens(pasted, 1000, count)
    assert pasted.startswith(opening) and COUNT(opening) == 1000 and max(counted) <= 16_000
