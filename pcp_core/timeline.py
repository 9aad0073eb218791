"""The Timeline (§IV): every page carries an absolute timestamp.

A turn's time is, in order of preference: the message's own ``timestamp``
field; the date a dated header in the conversation states for it — a message
that opens with a bracketed line holding a date ("[Session 3 - 1:56 pm on 8 May,
2023]", "[2024-03-05 10:00]") dates itself and the turns after it, up to the
next header; else the time the proxy first saw the message.
"""

from __future__ import annotations

import re
from datetime import datetime

__all__ = ["opens_with_date", "stated_time"]

# A bracketed first line holding a year: the shape of a dated header.
_HEADER = re.compile(r"^\[([^\]\n]*\b(?:1[89]|20)\d\d\b[^\]\n]*)\]")
_MONTHS = "january february march april may june july august september october november december".split()
_MONTH = r"(?P<month>" + "|".join(m[:3] for m in _MONTHS) + r")[a-z]*\.?"  # "May", "Sept.", "December"
_DAY_MONTH_YEAR = re.compile(r"\b(?P<day>\d{1,2})(?:st|nd|rd|th)?\s+" + _MONTH + r",?\s+(?P<year>\d{4})\b", re.I)
_MONTH_DAY_YEAR = re.compile(r"\b" + _MONTH + r"\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<year>\d{4})\b", re.I)
_ISO_DATE = re.compile(r"\b(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})\b")
_CLOCK = re.compile(r"\b(?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<second>\d{2}))?\s*(?P<half>[ap]\.?m\.?)?", re.I)


def opens_with_date(text: str) -> bool:
    """Whether ``text`` opens with a dated header line (it starts a new part of the conversation)."""
    return _HEADER.match(text) is not None


def stated_time(text: str) -> str | None:
    """The ISO-8601 time a dated header at the start of ``text`` states, if it states one that parses."""
    header = _HEADER.match(text)
    if header is None:
        return None
    line = header.group(1)
    date = _date(line)
    if date is None:
        return None
    clock = _CLOCK.search(line.replace(date[3], " "))
    try:
        moment = datetime(date[0], date[1], date[2], *_hour_minute_second(clock))
    except ValueError:  # "31 February", "25:00"
        return None
    return moment.isoformat()


def _date(line: str) -> tuple[int, int, int, str] | None:
    """(year, month, day, the matched text) of the first date in ``line``."""
    for pattern in (_ISO_DATE, _DAY_MONTH_YEAR, _MONTH_DAY_YEAR):
        found = pattern.search(line)
        if found:
            month = found.group("month")
            number = int(month) if month.isdigit() else [m[:3] for m in _MONTHS].index(month.lower()) + 1
            return int(found.group("year")), number, int(found.group("day")), found.group(0)
    return None


def _hour_minute_second(clock: re.Match[str] | None) -> tuple[int, int, int]:
    if clock is None:
        return 0, 0, 0
    hour = int(clock.group("hour")) % 24
    half = (clock.group("half") or "").lower().replace(".", "")
    if half == "pm" and hour < 12:
        hour += 12
    elif half == "am" and hour == 12:
        hour = 0
    return hour, int(clock.group("minute")), int(clock.group("second") or 0)
