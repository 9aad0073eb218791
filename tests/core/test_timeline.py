"""The Timeline (§IV): dates the conversation states become its pages' timestamps."""

from __future__ import annotations

from datetime import datetime

import pytest

from pcp_core.paging.history import page_history, turns_from_messages
from pcp_core.text.timeline import mentioned_periods, moment, opens_with_date, stated_time

from .counting import COUNT


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


# -- the forms people write dates in --------------------------------------------------


@pytest.mark.parametrize(
    ("text", "time"),
    [
        # Day first with dots, month first with slashes, year first with any of - / .
        ("[05.03.2024 10:15]\nstandup", "2024-03-05T10:15:00"),
        ("[Tuesday, 3/5/2024]\nstandup", "2024-03-05T00:00:00"),
        ("[2024/03/05]\nstandup", "2024-03-05T00:00:00"),
        ("[25/12/2023 9:00]\nparty", "2023-12-25T09:00:00"),  # 25 cannot be a month
        # A message's own date and time, as chat apps export messages.
        ("[05.03.24, 10:15:22] Alice: the keys are under the mat", "2024-03-05T10:15:22"),
        ("3/5/24, 10:15 PM - Alice: see you", "2024-03-05T22:15:00"),
        ("[10:15, 05/03/2024] Alice: hi", "2024-05-03T10:15:00"),  # slashes: month first
        ("2024-03-05 10:15 <alice> hi", "2024-03-05T10:15:00"),
        ("2024-03-05T10:15:00Z bob: deployed", "2024-03-05T10:15:00"),
        ("05.03.24 10:15 amazing news", "2024-03-05T10:15:00"),  # "am" of "amazing" is no half of the day
        # Not a stamp: no time of day, not at the start, not a date.
        ("1.2.30 is out", None),
        ("12/25 we meet", None),
        ("192.168.1.10 is down again", None),
        ("Alice: on 05.03.24, 10:15 we met", None),
    ],
)
def test_dates_in_the_forms_people_write_them(text, time):
    assert stated_time(text) == time


def test_a_message_stamp_dates_its_message_but_is_no_header():
    assert stated_time("[05.03.24, 10:15:22] Alice: hi") and not opens_with_date("[05.03.24, 10:15:22] Alice: hi")


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        ("05.03.2024 10:15", datetime(2024, 3, 5, 10, 15)),
        ("3/5/2024 10:15 PM", datetime(2024, 3, 5, 22, 15)),
        ("Tue, 05 Mar 2024 10:15:00 GMT", datetime(2024, 3, 5, 10, 15)),
        ("Tue, 05 Mar 2024 11:15:00 +0100", datetime(2024, 3, 5, 10, 15)),
        ("1709633700", datetime(2024, 3, 5, 10, 15)),  # seconds since 1970
        ("1709633700000", datetime(2024, 3, 5, 10, 15)),  # milliseconds
        ("tomorrow", None),
        ("12345", None),
    ],
)
def test_a_messages_own_timestamp_field_in_other_forms(timestamp, expected):
    assert moment(timestamp) == expected


def test_a_message_dated_by_its_stamp_or_its_field_dates_its_page():
    messages = [
        {"role": "user", "content": "[05.03.24, 10:15:22] Alice: where are the keys?"},
        {"role": "assistant", "content": "Under the mat."},
        {"role": "user", "content": "thanks", "timestamp": "Wed, 06 Mar 2024 08:00:00 GMT"},
    ]
    times = [t.timestamp for t in turns_from_messages(messages, "2026-11-23T09:00:00")]
    assert times[:2] == ["2024-03-05T10:15:22", "2024-03-05T10:15:22"]
    assert moment(times[2]) == datetime(2024, 3, 6, 8, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # NOW is Monday 23 November 2026
        ("on 5.3.2024?", [("2024-03-05", "2024-03-06")]),
        ("on 3/5/24?", [("2024-03-05", "2024-03-06")]),
        ("What did I say on Monday?", [("2026-11-16", "2026-11-17")]),  # the latest Monday before today
        ("What did we eat on Saturday?", [("2026-11-21", "2026-11-22")]),
        ("What did I say last Tuesday?", [("2026-11-17", "2026-11-18"), ("2026-11-10", "2026-11-11")]),  # either reading
        ("What do we do on Tuesdays?", []),  # a habit, not a day
        ("the day before yesterday", [("2026-11-21", "2026-11-22")]),
        ("what did you say 2 days ago", [("2026-11-21", "2026-11-22")]),
        ("three weeks ago", [("2026-10-30", "2026-11-06")]),  # the week around that day
        ("a month ago", [("2026-10-01", "2026-11-01")]),
        ("last weekend", [("2026-11-21", "2026-11-23")]),
        ("last year", [("2025-01-01", "2026-01-01")]),
        ("version 1.2.3.4", []),
    ],
)
def test_periods_in_the_forms_people_write_them(text, expected):
    assert [(s[:10], e[:10]) for s, e in spans(text)] == expected
