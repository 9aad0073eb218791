"""A summary says each chosen sentence once, with its speaker once: no phrase doubled that its page does not double.

Property tests over real turns of the LoCoMo dev split (read in place beside the
repository, never copied), with their speakers and without them, as a chat whose
turns name no speaker sends them: one page's summary, and a container's summary
of its pages' summaries.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcp_core.pages.summaries import extractive_summary
from pcp_core.text.terms import TermStats

DEV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "locomo-dev" / "conversations.jsonl"
SPEAKER = re.compile(r"^[A-Z]\w+: ")
SESSION = re.compile(r"^\[Session [^\]]*\]\n")


def dev_turns() -> list[str]:
    if not DEV.exists():
        return []
    turns = []
    for line in DEV.read_text().splitlines():
        turns += [SESSION.sub("", message["content"]) for message in json.loads(line)["messages"]]
    return turns


TURNS = dev_turns()
pytestmark = pytest.mark.skipif(not TURNS, reason=f"the dev data is not at {DEV}")


def doubled(text: str) -> set[str]:
    """Runs of two words or more said twice in a row, from a sentence's start, that are not whole sentences ("Yes. One
    thing: Yes. One thing: …"); a sentence two turns both say ("Talk soon. Talk soon.") is the conversation's own, and
    so are short sentences that end and start alike ("Thanks, Melanie! Yep, Melanie! Yep, Caroline."), and a whole
    turn two speakers both say, each followed by the next turn's speaker ("John: [shares image: a poster] Maria:
    [shares image: a poster] Maria: Thanks!")."""
    spoken = text.split()
    words = [word.lower() for word in spoken]
    ends = lambda word: word[-1:] in ".!?]"  # noqa: E731 (a bracketed caption is a sentence of its own)
    speaker = lambda i: spoken[i].endswith(":") and spoken[i][:-1].isalpha() and spoken[i][:1].isupper()  # noqa: E731
    found = set()
    for size in range(2, len(words) // 2 + 1):
        for start in range(len(words) - 2 * size + 1):
            opens = start == 0 or words[start - 1][-1:] in ".!?:"
            last = start + size - 1
            whole = ends(words[last]) or (speaker(last) and ends(words[last - 1]))
            if opens and not whole and words[start : start + size] == words[start + size : start + 2 * size]:
                found.add(" ".join(words[start : start + size]))
    return found


def summary(text: str, chars: int = 240) -> str:
    return extractive_summary(text, TermStats([text]).weights(text), chars)


PAGES = st.tuples(
    st.integers(min_value=0, max_value=max(len(TURNS) - 8, 0)), st.integers(min_value=1, max_value=6), st.booleans(), st.integers(min_value=80, max_value=400)
)


@settings(max_examples=300, deadline=None)
@given(page=PAGES)
def test_a_pages_summary_doubles_nothing_its_page_does_not(page):
    start, size, named, chars = page
    turns = TURNS[start : start + size] if named else [SPEAKER.sub("", turn) for turn in TURNS[start : start + size]]
    text = "\n".join(turns)
    said = summary(text, chars)
    assert doubled(said) <= doubled(text), said


@settings(max_examples=200, deadline=None)
@given(start=st.integers(min_value=0, max_value=max(len(TURNS) - 30, 0)), sizes=st.lists(st.integers(1, 6), min_size=2, max_size=4), named=st.booleans())
def test_a_containers_summary_of_summaries_doubles_nothing_they_do_not(start, sizes, named):
    children = []
    for size in sizes:  # the pages of a stretch of the conversation, one after another
        turns = TURNS[start : start + size] if named else [SPEAKER.sub("", turn) for turn in TURNS[start : start + size]]
        children.append(summary("\n".join(turns), 160))
        start += size
    text = "\n".join(children)
    said = summary(text)
    assert doubled(said) <= doubled(text), said


def test_a_sentence_that_opens_with_a_label_is_not_taken_for_a_speaker():
    assert summary("Yes. One important thing: the keys are under the mat.", 200) == "Yes. One important thing: the keys are under the mat."


def test_an_initial_does_not_end_a_sentence():
    text = "John: Have you read all of George R. R. Martin's books?"
    summary = extractive_summary(text, {"martin": 1.0, "books": 1.0}, 200)
    assert summary == text and not doubled(summary)


def test_a_sentence_said_twice_with_other_punctuation_is_summarised_once():
    text = "Melanie: Yeah, Caroline.\nMelanie: Thanks, Caroline.\nMelanie: Thanks, Caroline!"
    summary = extractive_summary(text, {"thanks": 1.0, "caroline": 1.0, "yeah": 0.5}, 200)
    assert summary.lower().count("thanks, caroline") == 1 and not doubled(summary)


_TIE = """
from pcp_core.pages.summaries import extractive_summary
# 0.1 + 0.2 + 0.3 is 0.6 or 0.6000000000000001 as the sum runs: a near tie with 0.6, the same length.
weights = {"kiwi": 0.1, "mango": 0.2, "plums": 0.3, "lemon": 0.6}
print(extractive_summary("Lemon grapefruit. Kiwi mango plums.", weights, 21))
"""


def test_a_summary_is_the_same_whatever_the_process_string_hashes() -> None:
    """Two workers page a shared conversation alike: a sentence's weight is not summed in the order of a set,
    which follows the process's string hashes (at a near tie, processes chose different sentences)."""
    root = Path(__file__).resolve().parents[2]
    chosen = {
        subprocess.run(
            [sys.executable, "-c", _TIE], env={**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(root)}, capture_output=True, text=True, check=True
        ).stdout.strip()
        for seed in range(12)
    }
    assert len(chosen) == 1, chosen


def test_the_doubling_check_tells_a_repeated_phrase_from_a_turn_two_speakers_say():
    assert doubled("Yes. One thing: Yes. One thing: the keys.") == {"yes. one thing:"}
    assert not doubled("John: [shares image: a poster] Maria: [shares image: a poster] Maria: Thanks!")
