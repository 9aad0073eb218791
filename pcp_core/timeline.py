"""The Timeline (§IV): every page carries an absolute timestamp.

A turn's time is, in order of preference: the message's own ``timestamp``
field; the date a dated header in the conversation states for it — a message
that opens with a bracketed line holding a date ("[Session 3 - 1:56 pm on 8 May,
2023]", "[2024-03-05 10:00]") dates itself and the turns after it, up to the
next header; else the time the proxy first saw the message.

The other way round, a query can name a time ("on 13 October, 2023", "in
July 2023", "in June", "yesterday"): ``mentioned_periods`` reads those periods,
so the Router can address pages by when they were said.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache

import msgspec

__all__ = ["Period", "mentioned_periods", "moment", "opens_with_date", "stated_time", "time_in"]

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
    return None if header is None else time_in(header.group(1))


def time_in(line: str) -> str | None:
    """The ISO-8601 time ``line`` states: its first date that parses, at the clock time beside it if any."""
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
            return (*_year_month_day(found), found.group(0))
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


# -- periods a query names ------------------------------------------------------------


class Period(msgspec.Struct, frozen=True):
    """A span of time, ``[start, end)``, as naive UTC datetimes."""

    start: datetime
    end: datetime

    def holds(self, when: datetime, grace: timedelta = timedelta(0)) -> bool:
        return self.start <= when < self.end + grace


_MONTH_YEAR = re.compile(r"\b" + _MONTH + r",?\s+(?P<year>\d{4})\b", re.I)
# A month without a year only after a word that makes it one ("in June"): "May" is also a verb.
_BARE_MONTH = re.compile(r"\b(?i:in|of|during|since|before|after|by|early|late|mid)[- ](?P<month>" + "|".join(m.capitalize() for m in _MONTHS) + r")\b")
_YEAR = re.compile(r"\b(?:in|of|during|since)\s+(?P<year>(?:19|20)\d\d)\b", re.I)
_RELATIVE = {"today": (0, 1), "yesterday": (1, 0), "this week": (7, 1), "last week": (14, 0), "this month": (31, 1), "last month": (62, 0)}  # days back, days on
_RELATIVE_WORDS = re.compile(r"\b(" + "|".join(_RELATIVE) + r")\b", re.I)
_YEARS_OF_A_BARE_MONTH = 30  # "in June": that month in each of the last years before now


def mentioned_periods(text: str, now: datetime) -> list[Period]:
    """The periods ``text`` names, most precise first: dates, months, years; else ``today``-style words.

    Each match is taken out of the text before the coarser patterns look, so
    "13 October, 2023" is one day, not also a month and a year.
    """
    periods: list[Period] = []
    for pattern in (_ISO_DATE, _DAY_MONTH_YEAR, _MONTH_DAY_YEAR):
        for found in pattern.finditer(text):
            day = _day(found)
            if day is not None:
                periods.append(Period(day, day + timedelta(days=1)))
        text = pattern.sub(" ", text)
    for found in _MONTH_YEAR.finditer(text):
        periods.append(_month(int(found.group("year")), _month_number(found.group("month"))))
    text = _MONTH_YEAR.sub(" ", text)
    for found in _BARE_MONTH.finditer(text):
        number = _month_number(found.group("month"))
        periods += [_month(year, number) for year in range(now.year - _YEARS_OF_A_BARE_MONTH, now.year + 1)]
    for found in _YEAR.finditer(text):
        year = int(found.group("year"))
        periods.append(Period(datetime(year, 1, 1), datetime(year + 1, 1, 1)))
    if not periods:
        today = now.replace(hour=0, minute=0, second=0, microsecond=0)
        for found in _RELATIVE_WORDS.finditer(text):
            back, on = _RELATIVE[found.group(1).lower()]
            periods.append(Period(today - timedelta(days=back), today + timedelta(days=on)))
    return periods


@lru_cache(maxsize=65536)
def moment(timestamp: str) -> datetime | None:
    """A page's ISO-8601 timestamp as a naive UTC datetime (None if it does not parse); cached per page."""
    try:
        parsed = datetime.fromisoformat(timestamp)
    except ValueError:
        return None
    return parsed.astimezone(UTC).replace(tzinfo=None) if parsed.tzinfo else parsed


def _month_number(name: str) -> int:
    return int(name) if name.isdigit() else [m[:3] for m in _MONTHS].index(name[:3].lower()) + 1


def _year_month_day(found: re.Match[str]) -> tuple[int, int, int]:
    """The date a match of ``_ISO_DATE``, ``_DAY_MONTH_YEAR`` or ``_MONTH_DAY_YEAR`` states."""
    return int(found.group("year")), _month_number(found.group("month")), int(found.group("day"))


def _day(found: re.Match[str]) -> datetime | None:
    try:
        return datetime(*_year_month_day(found))
    except ValueError:  # "31 February"
        return None


def _month(year: int, number: int) -> Period:
    return Period(datetime(year, number, 1), datetime(year + number // 12, number % 12 + 1, 1))
