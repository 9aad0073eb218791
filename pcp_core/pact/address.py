"""How a PACT component is addressed: coordinates ``(depth, position, offset)``, and selectors over them.

Both come from clients (an API's path and body, a request's inline
components) as text: each number is bounded before it is converted, so no
text of thousands of digits is ever made an integer, and none past what a
store keeps is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import msgspec

__all__ = ["COORDINATE", "HIGHEST", "Coordinates", "PactError", "Selector", "parse_coordinates", "parse_selector"]


class PactError(ValueError):
    """A coordinate, selector or insertion the rules refuse; the message says where.

    ``param``: the request field it is about, when it came with a request (``on_request``).
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class Coordinates(NamedTuple):
    depth: int
    position: int
    offset: int

    def __str__(self) -> str:
        return f"d{self.depth},{self.position},{self.offset}"


_FIELDS = ("depth", "position", "offset")
_INT = re.compile(r"\A[+-]?\d+\Z")
# Numbers are kept as signed 64-bit integers (msgpack, Redis): a value past them is refused, not lost at save.
# Coordinates keep half of that range: a moving component's depth grows by a turn at each request.
HIGHEST = 2**63 - 1
COORDINATE = 2**62
_DIGITS = 19  # no more digits than HIGHEST has: int() of thousands of them is slow, and past 4,300 it raises


def parse_coordinates(text: str) -> Coordinates:
    """``"d0,1,0"`` (the ``d``, the spaces and surrounding parentheses optional) as coordinates."""
    values = []
    for name, field in zip(_FIELDS, _three_fields(text, "coordinates")):
        if not _INT.match(field):
            raise PactError(f"{_quoted(text)}: the {name} must be a whole number, not {_quoted(field)}")
        values.append(_bounded(text, name, field))
    at = Coordinates(*values)
    if at.depth < -1:
        raise PactError(f"{text!r}: the depth must be -1 (system level), 0 (the current message) or more")
    if at.position == 0 and at.offset == 0:
        raise PactError(f"{text!r}: position 0, offset 0 is the message itself; a component goes at position 1 or more, or at another offset")
    return at


def _bounded(text: str, name: str, digits: str) -> int:
    """``digits`` (a whole number) as an int, or the PactError for one past what a store keeps."""
    value = int(digits) if len(digits.lstrip("+-")) <= _DIGITS else None
    if value is None or not -COORDINATE <= value <= COORDINATE:
        raise PactError(f"{_quoted(text)}: the {name} must be between -2^62 and 2^62")
    return value


def _quoted(text: str) -> str:
    """A client's text in a message: quoted, and cut short when it is long."""
    return repr(text) if len(text) <= 60 else repr(text[:60]) + f"… ({len(text)} characters)"


def _three_fields(text: str, what: str) -> list[str]:
    """The three comma-separated fields of coordinates or selectors, parentheses optional."""
    inner = text.strip()
    if inner.startswith("(") and inner.endswith(")"):
        inner = inner[1:-1]
    fields = [f.strip() for f in inner.split(",")]
    if len(fields) != 3:
        raise PactError(f'{text!r}: {what} have three fields, depth, position and offset (as in "d1,1,0"), not {len(fields)}')
    if fields[0][:1] in ("d", "D"):
        fields[0] = fields[0][1:].strip()
    return fields


# -- selectors -----------------------------------------------------------------------------

Range = tuple[int, int]  # inclusive


class Placed(Protocol):
    """What a selector reads of a component: its coordinates, key and tags."""

    @property
    def depth(self) -> int:
        """Its depth in the tree."""
        ...

    @property
    def position(self) -> int:
        """Its place among its siblings."""
        ...

    @property
    def offset(self) -> int:
        """Its offset around the core it is attached to (below 0: before it)."""
        ...

    @property
    def key(self) -> str | None:
        """Its key."""
        ...

    @property
    def tags(self) -> Sequence[str]:
        """Its tags."""
        ...


_RANGE = re.compile(r"\A([+-]?\d+)(?:(?:\.\.|-)([+-]?\d+))?\Z")


class Selector(msgspec.Struct, frozen=True):
    """Which components a query selects: coordinates whose fields are a number, a range or ``*``; or a key, or a tag."""

    depth: Range | None = None  # None: any
    position: Range | None = None
    offset: Range | None = None
    key: str | None = None
    tag: str | None = None

    def matches(self, component: Placed) -> bool:
        """Whether ``component`` is one this selector picks."""
        if self.key is not None or self.tag is not None:
            return component.key == self.key if self.key is not None else self.tag in component.tags
        at = (component.depth, component.position, component.offset)
        return all(r is None or r[0] <= v <= r[1] for r, v in zip((self.depth, self.position, self.offset), at))


def parse_selector(text: str) -> Selector:
    """``"d1-3,1,*"``, ``"d*,*,-2..-1"``, ``"#key"`` or ``"+tag"`` as a selector.

    A range is ``a-b`` or ``a..b`` (inclusive; ``-3--1`` and ``-3..-1`` are the
    same); ``*`` is any value.
    """
    text = text.strip()
    if text[:1] in ("#", "+") and len(text) > 1:
        return Selector(key=text[1:]) if text[0] == "#" else Selector(tag=text[1:])
    depth, position, offset = (_range(text, name, field) for name, field in zip(_FIELDS, _three_fields(text, "selectors")))
    return Selector(depth, position, offset)


def _range(text: str, name: str, field: str) -> Range | None:
    """One field of a selector as a range (None for ``*``)."""
    if field == "*":
        return None
    match = _RANGE.match(field)
    if match is None:
        raise PactError(f"{_quoted(text)}: the {name} must be a number, a range such as 1-3 or 1..3, or *, not {_quoted(field)}")
    low = _bounded(text, name, match.group(1))
    high = _bounded(text, name, match.group(2)) if match.group(2) is not None else low
    if high < low:
        raise PactError(f"{text!r}: the {name} range {field!r} runs backwards ({low} > {high})")
    return low, high


# -- components and their tree ---------------------------------------------------------------
