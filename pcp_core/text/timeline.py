"""The Timeline (§IV): every page carries an absolute timestamp.

A turn's time is, in order of preference: the message's own ``timestamp``
field (``moment`` reads the forms clients write); the date the conversation
states for it — a message that opens with a bracketed line holding a date
("[Session 3 - 1:56 pm on 8 May, 2023]", "[2024-03-05 10:00]"), or with its
own date and time as chat apps export messages ("[05.03.24, 10:15:22] Alice:"),
dates itself and the turns after it, up to the next; else the time the proxy
first saw the message.

The other way round, a query can name a time ("on 13 October, 2023", "on
5.3.2024", "in July 2023", "in June", "yesterday", "last Tuesday"):
``mentioned_periods`` reads those periods, so the Router can address pages by
when they were written.

Dates are read in the forms people write them, whatever the locale's order
would be: names of months in either order, the year first with any
separator, day first with dots and month first with slashes. The order of a
numeric date is a convention, not a certainty: "05/03/2024" is read as 3 May.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from functools import lru_cache

import msgspec

__all__ = ["Period", "mentioned_periods", "moment", "opens_with_date", "stated_time", "time_in"]

# A bracketed first line holding a year: the shape of a dated header.
_HEADER = re.compile(r"^\[([^\]\n]*\b(?:1[89]|20)\d\d\b[^\]\n]*)\]")
_MONTHS = "january february march april may june july august september october november december".split()
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
_MONTH = r"(?P<month>" + "|".join(m[:3] for m in _MONTHS) + r")[a-z]*\.?"  # "May", "Sept.", "December"
_DAY_MONTH_YEAR = re.compile(r"\b(?P<day>\d{1,2})(?:st|nd|rd|th)?\s+" + _MONTH + r",?\s+(?P<year>\d{4})\b", re.I)
_MONTH_DAY_YEAR = re.compile(r"\b" + _MONTH + r"\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<year>\d{4})\b", re.I)
# Year first, as ISO 8601 and East Asian dates write it: "2024-03-05", "2024/3/5", "2024.03.05".
_ISO_DATE = re.compile(r"\b(?P<year>\d{4})(?P<sep>[-/.])(?P<month>\d{1,2})(?P=sep)(?P<day>\d{1,2})(?!\d)")
# All in digits, the year last: day.month.year with dots ("05.03.2024", "5.3.24"), month/day/year with
# slashes ("3/5/2024", "03/05/24"; read day first when the first number cannot be a month: "25/12/2023").
# Not inside a longer run of dotted numbers (an IP address, a version 1.2.3.4).
_DOTTED_DATE = re.compile(r"(?<![\d.])(?P<day>\d{1,2})\.(?P<month>\d{1,2})\.(?P<year>\d{4}|\d{2})(?![\d]|\.\d)")
_SLASHED_DATE = re.compile(r"(?<![\d/])(?P<month>\d{1,2})/(?P<day>\d{1,2})/(?P<year>\d{4}|\d{2})(?![\d]|/\d)")
_DATES = (_ISO_DATE, _DAY_MONTH_YEAR, _MONTH_DAY_YEAR, _DOTTED_DATE, _SLASHED_DATE)
_TIME_OF_DAY = r"(?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<second>\d{2}))?\s*(?P<half>[ap]\.?m\b\.?)?"
_CLOCK = re.compile(r"\b" + _TIME_OF_DAY, re.I)
# What may stand before a message's own date ("[", its time of day first) and join the date to its time.
_BEFORE_STAMP = re.compile(r"\[?\s*(?:" + _TIME_OF_DAY + r"[,\s]+)?", re.I)
_STAMP_CLOCK = re.compile(r"(?:,?\s+|T)" + _TIME_OF_DAY, re.I)
# How a message that opens with its own stamp starts: a digit, or a month's name and a day, maybe
# bracketed. Read first: most messages fail it at once, and the date forms are not searched for.
_STAMP_START = re.compile(r"\s*\[?\s*(?:\d|" + _MONTH + r"\s+\d)", re.I)
_EPOCH = re.compile(r"(?P<seconds>\d{9,10})(?:\.\d+)?|(?P<milliseconds>\d{12,13})")


def opens_with_date(text: str) -> bool:
    """Whether ``text`` opens with a dated header line (it starts a new part of the conversation)."""
    return _HEADER.match(text) is not None


def stated_time(text: str) -> str | None:
    """The ISO-8601 time ``text`` states for itself, if it states one that parses.

    A dated header at its start ("[Session 3 - 1:56 pm on 8 May, 2023]"), or
    the message's own date and time written before it, as chat apps export
    messages ("[05.03.24, 10:15:22] Alice: …", "3/5/24, 10:15 PM - Alice: …",
    "2024-03-05 10:15 <alice> …"); a stamp needs its time of day, so that a
    message opening with a number ("1.2.30 is out") is not read as one.
    """
    header = _HEADER.match(text)
    if header is not None:
        return time_in(header.group(1))
    return _stamp_time(text[:64])


def time_in(line: str) -> str | None:
    """The ISO-8601 time ``line`` states: its first date that parses, at the clock time beside it if any."""
    date = _date(line)
    if date is None:
        return None
    clock = _CLOCK.search(line.replace(date[3], " "))
    return _iso(date, clock)


def _iso(date: tuple[int, int, int, str], clock: re.Match[str] | None) -> str | None:
    """``date`` at the time of ``clock`` in ISO 8601 (None when no such day or time)."""
    try:
        moment = datetime(date[0], date[1], date[2], *_hour_minute_second(clock))
    except ValueError:  # "31 February", "25:00"
        return None
    return moment.isoformat()


def _stamp_time(text: str) -> str | None:
    """The time of a date and a time of day that open ``text`` (a message's own stamp), if they do."""
    if _STAMP_START.match(text) is None:
        return None
    found = _first_date(text)
    if found is None:
        return None
    date, start, end = found
    before = _BEFORE_STAMP.fullmatch(text[:start])
    if before is None:
        return None
    clock = _STAMP_CLOCK.match(text, end)
    if before.group("hour") is not None:
        clock = _CLOCK.search(before.group(0))
    return _iso(date, clock) if clock is not None else None


def _date(line: str) -> tuple[int, int, int, str] | None:
    """(year, month, day, the matched text) of the first date in ``line``."""
    found = _first_date(line)
    return None if found is None else found[0]


def _first_date(line: str) -> tuple[tuple[int, int, int, str], int, int] | None:
    """The first date in ``line`` of any form, and where it starts and ends."""
    matches = [found for pattern in _DATES if (found := pattern.search(line))]
    if not matches:
        return None
    first = min(matches, key=lambda m: m.start())
    return (*_year_month_day(first), first.group(0)), first.start(), first.end()


def _hour_minute_second(clock: re.Match[str] | None) -> tuple[int, int, int]:
    """The hour, minute and second ``clock`` states, on a 24-hour clock (midnight when none)."""
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
        """Whether ``when`` falls in the period, or within ``grace`` after it."""
        return self.start <= when < self.end + grace


_MONTH_YEAR = re.compile(r"\b" + _MONTH + r",?\s+(?P<year>\d{4})\b", re.I)
# A month without a year only after a word that makes it one ("in June"): "May" is also a verb.
_BARE_MONTH = re.compile(r"\b(?i:in|of|during|since|before|after|by|early|late|mid)[- ](?P<month>" + "|".join(m.capitalize() for m in _MONTHS) + r")\b")
_YEAR = re.compile(r"\b(?:in|of|during|since)\s+(?P<year>(?:19|20)\d\d)\b", re.I)
_RELATIVE = {
    "today": (0, 1),
    "yesterday": (1, 0),
    "this week": (7, 1),
    "last week": (14, 0),
    "this month": (31, 1),
    "last month": (62, 0),
}  # days back, days on
_RELATIVE_WORDS = re.compile(r"\b(" + "|".join(_RELATIVE) + r")\b", re.I)
_DAY_BEFORE_YESTERDAY = re.compile(r"\bthe day before yesterday\b", re.I)
_NUMBER_WORDS = {"a": 1, "an": 1} | {w: n for n, w in enumerate("one two three four five six seven eight nine ten eleven twelve".split(), 1)}
_AGO = re.compile(r"\b(?P<count>\d{1,3}|" + "|".join(_NUMBER_WORDS) + r")\s+(?P<unit>day|week|month|year)s?\s+ago\b", re.I)
_WEEKEND = re.compile(r"\b(?:last|this|past|the)\s+weekend\b", re.I)
_CALENDAR_YEAR = re.compile(r"\b(?P<which>last|this)\s+year\b", re.I)
# A weekday names the latest such day before today; "last Tuesday" may also mean the one a week before.
# Not a plural ("on Tuesdays" is a habit, not a day).
_WEEKDAY = re.compile(r"\b(?P<last>last\s+)?(?P<weekday>" + "|".join(_WEEKDAYS) + r")\b(?!s)", re.I)
_YEARS_OF_A_BARE_MONTH = 30  # "in June": that month in each of the last years before now


def mentioned_periods(text: str, now: datetime) -> list[Period]:
    """The periods ``text`` names, most precise first: dates, months, years; else ``today``-style words.

    Each match is taken out of the text before the coarser patterns look, so
    "13 October, 2023" is one day, not also a month and a year. Words that
    count back from now ("yesterday", "last Tuesday", "three weeks ago")
    are read only when no date is named.
    """
    periods: list[Period] = []
    for pattern in _DATES:
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
        periods.append(_year(int(found.group("year"))))
    return periods or _counted_back(text, now.replace(hour=0, minute=0, second=0, microsecond=0))


def _counted_back(text: str, today: datetime) -> list[Period]:
    """The periods of words that count back from ``today``, each taken out of the text once read."""
    periods: list[Period] = []

    def days(back: int, length: int = 1) -> Period:
        """The ``length`` days that start ``back`` days before today."""
        return Period(today - timedelta(days=back), today - timedelta(days=back - length))

    for _ in _DAY_BEFORE_YESTERDAY.finditer(text):
        periods.append(days(2))
    text = _DAY_BEFORE_YESTERDAY.sub(" ", text)
    for found in _AGO.finditer(text):
        word, unit = found.group("count").lower(), found.group("unit").lower()
        count = int(word) if word.isdigit() else _NUMBER_WORDS[word]
        if unit == "day":
            periods.append(days(count))
        elif unit == "week":  # about then: the week around that day
            periods.append(days(7 * count + 3, 7))
        elif unit == "month":
            months = today.year * 12 + today.month - 1 - count
            periods.append(_month(months // 12, months % 12 + 1))
        else:
            periods.append(_year(today.year - count))
    text = _AGO.sub(" ", text)
    for _ in _WEEKEND.finditer(text):
        periods.append(days((today.weekday() - 5) % 7 or 7, 2))  # the latest Saturday before today, and its Sunday
    text = _WEEKEND.sub(" ", text)
    for found in _CALENDAR_YEAR.finditer(text):
        periods.append(_year(today.year - (found.group("which").lower() == "last")))
    text = _CALENDAR_YEAR.sub(" ", text)
    for found in _WEEKDAY.finditer(text):
        back = (today.weekday() - _WEEKDAYS.index(found.group("weekday").lower())) % 7 or 7
        periods += [days(back), days(back + 7)] if found.group("last") else [days(back)]
    text = _WEEKDAY.sub(" ", text)
    for found in _RELATIVE_WORDS.finditer(text):
        back, on = _RELATIVE[found.group(1).lower()]
        periods.append(Period(today - timedelta(days=back), today + timedelta(days=on)))
    return periods


@lru_cache(maxsize=65536)
def moment(timestamp: str) -> datetime | None:
    """A timestamp as a naive UTC datetime (None if it does not parse); cached per page.

    ISO 8601 above all, as the proxy writes them; a message's own
    ``timestamp`` field may be in another form a client wrote: an e-mail
    style date ("Tue, 05 Mar 2024 10:15:00 GMT"), seconds or milliseconds
    since 1970 ("1709633700", "1709633700123"), or a date as
    ``time_in`` reads one ("05.03.2024 10:15", "3/5/2024 10:15 PM").
    """
    parsed: datetime | None
    try:
        parsed = datetime.fromisoformat(timestamp)
    except ValueError:
        parsed = _other_moment(timestamp.strip())
        if parsed is None:
            return None
    return parsed.astimezone(UTC).replace(tzinfo=None) if parsed.tzinfo else parsed


def _other_moment(timestamp: str) -> datetime | None:
    """A timestamp in another form than ISO 8601: epoch seconds or milliseconds, an email date, or a time stated in it."""
    epoch = _EPOCH.fullmatch(timestamp)
    if epoch is not None:
        seconds = int(epoch.group("seconds")) if epoch.group("seconds") else int(epoch.group("milliseconds")) / 1000
        return datetime.fromtimestamp(seconds, UTC)
    try:
        return parsedate_to_datetime(timestamp)
    except (TypeError, ValueError, IndexError):
        stated = time_in(timestamp)
        return None if stated is None else datetime.fromisoformat(stated)


def _month_number(name: str) -> int:
    """A month's number from its number or name."""
    return int(name) if name.isdigit() else [m[:3] for m in _MONTHS].index(name[:3].lower()) + 1


def _year_month_day(found: re.Match[str]) -> tuple[int, int, int]:
    """The date a match of one of ``_DATES`` states (a two-digit year is this century's, or the last's from 70)."""
    year, month, day = int(found.group("year")), _month_number(found.group("month")), int(found.group("day"))
    if year < 100:
        year += 2000 if year < 70 else 1900
    if found.re is _SLASHED_DATE and month > 12 >= day:  # "25/12/2023" can only be day first
        month, day = day, month
    return year, month, day


def _day(found: re.Match[str]) -> datetime | None:
    """The day a date match names (None when there is no such day)."""
    try:
        return datetime(*_year_month_day(found))
    except ValueError:  # "31 February"
        return None


def _month(year: int, number: int) -> Period:
    """The period of month ``number`` of ``year``."""
    return Period(datetime(year, number, 1), datetime(year + number // 12, number % 12 + 1, 1))


def _year(year: int) -> Period:
    """The period of ``year``."""
    return Period(datetime(year, 1, 1), datetime(year + 1, 1, 1))
