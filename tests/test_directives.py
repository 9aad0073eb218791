"""Directive parsing: whole, one character at a time, and at random splits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcp_core.delivery import AnswerGate
from pcp_core.directives import MAX_DIRECTIVE_CHARS, BusFault, Consult, DirectiveParser, Explore, Shelve, Text, parse_directives

REPLIES = [
    'I need the date. Consult("the date is missing", "a1b2c3d4")',
    "Consult(need detail, a1b2c3d4)\nShelve('done with it', f00dbeef)",
    'Let me check `Explore("find budget", "history", "budget, Q3, revenue")` first.',
    'Consult(reason="quoted \\"inner\\" text", id="abc12345") and then some prose.',
    "I will consult the notes. Consultation is useful. reConsult(x, y) is not one.",
    'Explore(r, "file:report.pdf", "a", "b") Explore(r, h, ["x", "y"])',
    "Consult (spaced, 1234abcd) Shelve(only-one)",
    "No directives here at all, just an answer with (parentheses) and Cons.",
]


def events_of(chunks) -> list:
    parser = DirectiveParser()
    events = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.flush()


def normalized(events) -> tuple[str, list]:
    return "".join(e.text for e in events if isinstance(e, Text)), [e for e in events if not isinstance(e, Text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('Consult("r", "a1")', [Consult("r", "a1")]),
        ("Consult(r, a1)", [Consult("r", "a1")]),
        ("Shelve('it is done', 'b2')", [Shelve("it is done", "b2")]),
        ('Consult(id="c3", reason="r")', [Consult("r", "c3")]),
        ('Consult("say \\"hi\\", ok", "d4")', [Consult('say "hi", ok', "d4")]),
        ('Explore("r", "history", "budget, Q3")', [Explore("r", "history", ("budget", "Q3"))]),
        ('Explore(r, h, "a", "b")', [Explore("r", "h", ("a", "b"))]),
        ('Explore(r, h, ["a", "b"])', [Explore("r", "h", ("a", "b"))]),
        ("Consult(a, b)\nShelve(c, d)", [Consult("a", "b"), Shelve("c", "d")]),
        ("Consult  (a, b)", [Consult("a", "b")]),
    ],
)
def test_forms(text, expected):
    clean, directives, faults = parse_directives(text)
    assert directives == expected and faults == []


def test_text_around_directives_is_kept_and_directives_removed():
    clean, directives, _ = parse_directives('Hmm. Consult("r", "a1") Then more.')
    assert clean == "Hmm.  Then more." and directives == [Consult("r", "a1")]


@pytest.mark.parametrize("text", ["I will consult the notes.", "Consultation helps", "reConsult(a, b)", "CONSULT(a, b)", "Consult the page"])
def test_lookalikes_are_text(text):
    assert parse_directives(text) == (text, [], [])


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("Consult(a1b2)", "needs 2 arguments (reason, id), got 1"),
        ("Shelve(a, b, c)", "needs 2 arguments"),
        ('Consult("r", "")', "needs a page id"),
        ("Consult(r, id=x, page=y)", "no argument named 'page'"),
        ('Consult("r", "a1"', "unterminated"),
        ('Consult("r, a1)', "unterminated"),
        ("Explore(r, h)", "needs 3 arguments"),
        ('Explore(r, "", k)', "needs a handle"),
        ('Explore(r, h, " , ")', "at least one keyword"),
    ],
)
def test_bus_faults_explain_themselves(text, fragment):
    clean, directives, faults = parse_directives(text)
    assert directives == [] and len(faults) == 1
    assert fragment in faults[0].reason and faults[0].raw.startswith(text.split("(")[0])
    assert clean == ""


def test_a_runaway_directive_is_faulted_without_waiting_for_the_end():
    parser = DirectiveParser()
    events = parser.feed('Consult("' + "x" * (MAX_DIRECTIVE_CHARS + 10))
    assert any(isinstance(e, BusFault) and "unterminated" in e.reason for e in events)
    assert parser.feed(" tail") == [Text(" tail")]


def test_text_is_released_as_soon_as_it_is_disambiguated():
    parser = DirectiveParser()
    assert parser.feed("I Cons") == [Text("I ")]
    assert parser.feed("ider") == [Text("Consider")]
    assert parser.feed(" it. Consult(r,") == [Text(" it. ")]
    assert parser.feed(" a1) ok") == [Consult("r", "a1"), Text(" ok")]
    assert parser.flush() == []


@pytest.mark.parametrize("reply", REPLIES)
def test_character_by_character_equals_whole(reply):
    assert normalized(events_of(list(reply))) == normalized(events_of([reply]))


@settings(max_examples=200, deadline=None)
@given(reply=st.sampled_from(REPLIES), cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_random_splits_equal_whole(reply, cuts):
    points = sorted({c % (len(reply) + 1) for c in cuts})
    chunks = [reply[a:b] for a, b in zip([0, *points], [*points, len(reply)])]
    assert normalized(events_of(chunks)) == normalized(events_of([reply]))


_prose = st.text(alphabet=st.sampled_from(list("abc ,.()'\"\nCSE")), max_size=30)
_directive = st.builds(lambda r, i: f'Consult("{r}", "{i}")', st.text(alphabet="abc xyz", max_size=8), st.text(alphabet="0123456789abcdef", min_size=1, max_size=8))


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.one_of(_prose, _directive), max_size=6), cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=10))
def test_generated_replies_parse_the_same_however_split(parts, cuts):
    reply = "".join(parts)
    points = sorted({c % (len(reply) + 1) for c in cuts})
    chunks = [reply[a:b] for a, b in zip([0, *points], [*points, len(reply)])]
    assert normalized(events_of(chunks)) == normalized(events_of([reply])) == normalized(events_of(list(reply)))


def test_long_replies_parse_in_linear_time():
    import time

    reply = ("plain words and (parens) with Consult(r, a1) here. " * 4000)[:200_000]
    start = time.perf_counter()
    clean, directives, _ = parse_directives(reply)
    assert time.perf_counter() - start < 5
    assert len(directives) > 3000


# -- the answer gate ----------------------------------------------------------------


def test_gate_holds_a_directive_round_back():
    gate = AnswerGate(final=False)
    released = gate.feed("Let me look. ") + gate.feed('Consult("r", "a1")') + gate.close()
    assert released == "" and gate.saw_directive and not gate.committed
    assert 'Consult("r", "a1")' in gate.raw_text


def test_gate_commits_after_enough_prose_and_drops_late_directives():
    gate = AnswerGate(final=False, commit_chars=20)
    first = gate.feed("The answer is forty-two, ")
    rest = gate.feed('because Consult("r", "a1") said so.') + gate.close()
    assert gate.committed and first == "The answer is forty-two, "
    assert rest == "because  said so."


def test_gate_releases_a_short_answer_at_the_end():
    gate = AnswerGate(final=False)
    assert gate.feed("Yes.") == ""
    assert gate.close() == "Yes." and gate.committed


def test_final_round_gate_streams_at_once():
    gate = AnswerGate(final=True)
    assert gate.feed("Hel") == "Hel"
