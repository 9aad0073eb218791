"""Worker directives (§7.3) and an incremental parser for them.

``Consult(reason, id)``, ``Explore(reason, handle, keywords)`` and
``Shelve(reason, id)`` may appear anywhere in a reply, several at a time, with
arguments quoted (``"…"`` or ``'…'``, backslash escapes) or bare, positional
or as ``name=value``. Everything else is text.

The parser is fed chunks as they stream in (``feed``) and told when the reply
ends (``flush``). It releases text as soon as the text cannot be the start of a
directive, and yields the same events whatever the chunking. A directive it
cannot read is a ``BusFault`` (§2.4) whose reason is written for the model.
"""

from __future__ import annotations

import re

import msgspec

__all__ = [
    "BusFault",
    "Consult",
    "Directive",
    "DirectiveParser",
    "Event",
    "Explore",
    "Shelve",
    "Text",
    "parse_directives",
]

# A directive still open after this many characters is a runaway: fault it, free the text.
MAX_DIRECTIVE_CHARS = 2000
NAMES = ("Consult", "Explore", "Shelve")
_MAX_GAP = 16  # whitespace allowed between a name and its "("


class Consult(msgspec.Struct, frozen=True, tag=True):
    reason: str
    id: str


class Explore(msgspec.Struct, frozen=True, tag=True):
    reason: str
    handle: str
    keywords: tuple[str, ...]


class Shelve(msgspec.Struct, frozen=True, tag=True):
    reason: str
    id: str


class Text(msgspec.Struct, frozen=True):
    text: str


class BusFault(msgspec.Struct, frozen=True):
    raw: str
    reason: str


Directive = Consult | Explore | Shelve
Event = Text | Consult | Explore | Shelve | BusFault

_START = re.compile(r"(?<![A-Za-z0-9_])(Consult|Explore|Shelve)[ \t\r\n]{0,%d}\(" % _MAX_GAP)
# What may still grow into a directive start at the very end of the buffer.
_PREFIXES = sorted({n[:i] for n in NAMES for i in range(1, len(n) + 1)}, key=len, reverse=True)
_TAIL = re.compile(r"(?<![A-Za-z0-9_])(?:(?:%s)[ \t\r\n]{0,%d}|%s)\Z" % ("|".join(NAMES), _MAX_GAP, "|".join(_PREFIXES)))
_KEYWORD_ARG = re.compile(r"\s*([A-Za-z_]+)\s*=\s*(.*)\Z", re.S)
_FIELDS = {"Consult": ("reason", "id"), "Shelve": ("reason", "id"), "Explore": ("reason", "handle", "keywords")}


class DirectiveParser:
    def __init__(self) -> None:
        self._buffer = ""
        self._before = ""  # the last character already consumed: "re" + "Consult(" is no directive

    def feed(self, chunk: str) -> list[Event]:
        self._buffer += chunk
        return self._drain(final=False)

    def flush(self) -> list[Event]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[Event]:
        events: list[Event] = []
        buffer = self._buffer
        while buffer:
            start = _START.search(buffer)
            if start is not None and start.start() == 0 and _is_word(self._before):
                start = _START.search(buffer, 1)
            if start is None:
                keep = 0 if final else _held_tail(buffer, self._before)
                released = buffer[: len(buffer) - keep]
                _text(events, released)
                self._before = released[-1] if released else self._before
                buffer = buffer[len(buffer) - keep :]
                break
            _text(events, buffer[: start.start()])
            self._before = buffer[start.start() - 1] if start.start() else self._before
            buffer = buffer[start.start() :]
            end = _closing_paren(buffer, start.end() - start.start())
            if end is None:
                if final or len(buffer) > MAX_DIRECTIVE_CHARS:
                    raw = buffer[:MAX_DIRECTIVE_CHARS] if not final else buffer
                    why = "unterminated: no closing ')' before the reply ended" if final else f"unterminated after {MAX_DIRECTIVE_CHARS} characters"
                    events.append(BusFault(raw=raw, reason=f"{start.group(1)} is {why}: {_preview(raw)}"))
                    buffer = buffer[len(raw) :]
                    self._before = raw[-1]
                    continue
                break  # wait for the rest of it
            raw = buffer[: end + 1]
            events.append(_build(start.group(1), raw, raw[start.end() - start.start() : end]))
            buffer = buffer[end + 1 :]
            self._before = ")"
        self._buffer = buffer
        return events


def parse_directives(text: str) -> tuple[str, list[Directive], list[BusFault]]:
    """Parse a whole reply: its text without directives, the directives, the faults."""
    parser = DirectiveParser()
    events = parser.feed(text) + parser.flush()
    clean = "".join(e.text for e in events if isinstance(e, Text))
    return clean, [e for e in events if isinstance(e, Consult | Explore | Shelve)], [e for e in events if isinstance(e, BusFault)]


# -- scanning --------------------------------------------------------------------


def _text(events: list[Event], text: str) -> None:
    if text:
        events.append(Text(text))


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _held_tail(buffer: str, before: str) -> int:
    """Length of the suffix that could still become a directive start."""
    window = buffer[-(max(map(len, NAMES)) + _MAX_GAP + 1) :]
    match = _TAIL.search(window)
    if match is None:
        return 0
    # The lookbehind saw only the window; check the character before it in the buffer.
    at = len(buffer) - len(window) + match.start()
    if _is_word(buffer[at - 1] if at > 0 else before):
        return 0
    return len(buffer) - at


def _closing_paren(text: str, start: int) -> int | None:
    """Index of the ")" closing the argument list that begins at ``start``, quotes respected."""
    quote, depth, i = "", 0, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif ch == ")" and depth == 0:
            return i
        i += 1
    return None


def _split_args(inner: str) -> list[str]:
    """Top-level comma-separated pieces, quotes and brackets respected."""
    pieces, current, quote, depth, i = [], [], "", 0, 0
    while i < len(inner):
        ch = inner[i]
        if quote:
            if ch == "\\" and i + 1 < len(inner):
                current.append(ch + inner[i + 1])
                i += 2
                continue
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif ch == "," and depth == 0:
            pieces.append("".join(current))
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    pieces.append("".join(current))
    return [p.strip() for p in pieces] if any(p.strip() for p in pieces) else []


def _value(arg: str) -> str | list[str]:
    """A quoted string unescaped, a [list] of values, or bare text."""
    arg = arg.strip()
    if len(arg) >= 2 and arg[0] in "\"'" and arg[-1] == arg[0]:
        return re.sub(r"\\(.)", r"\1", arg[1:-1], flags=re.S)
    if arg.startswith("[") and arg.endswith("]"):
        return [v for v in (_value(p) for p in _split_args(arg[1:-1])) if isinstance(v, str)]
    return arg


# -- building --------------------------------------------------------------------


def _build(name: str, raw: str, inner: str) -> Directive | BusFault:
    fields = _FIELDS[name]
    values: dict[str, str | list[str]] = {}
    positional: list[str | list[str]] = []
    for arg in _split_args(inner):
        keyword = _KEYWORD_ARG.match(arg) if arg[:1] not in "\"'[" else None
        if keyword and keyword.group(1) in fields:
            values[keyword.group(1)] = _value(keyword.group(2))
        elif keyword and not arg.startswith(keyword.group(1) + " "):
            return BusFault(raw, f"{name} has no argument named {keyword.group(1)!r}; it takes ({', '.join(fields)}): {_preview(raw)}")
        else:
            positional.append(_value(arg))
    for field in fields:
        if field not in values and positional:
            values[field] = positional.pop(0)
    if name == "Explore":
        return _explore(raw, values, positional)
    if positional or len(values) != 2:
        given = len(values) + len(positional)
        return BusFault(raw, f"{name} needs 2 arguments (reason, id), got {given}: {_preview(raw)}")
    reason, page_id = _text_of(values["reason"]), _text_of(values["id"])
    if not page_id:
        return BusFault(raw, f"{name} needs a page id: {_preview(raw)}")
    return (Consult if name == "Consult" else Shelve)(reason=reason, id=page_id)


def _explore(raw: str, values: dict[str, str | list[str]], extra: list[str | list[str]]) -> Explore | BusFault:
    if "keywords" not in values:
        return BusFault(raw, f"Explore needs 3 arguments (reason, handle, keywords), got {len(values)}: {_preview(raw)}")
    keywords: list[str] = []
    for value in [values["keywords"], *extra]:  # trailing arguments are more keywords
        for item in value if isinstance(value, list) else [value]:
            keywords += [k.strip() for k in item.split(",") if k.strip()]
    handle = _text_of(values["handle"])
    if not handle:
        return BusFault(raw, f"Explore needs a handle: {_preview(raw)}")
    if not keywords:
        return BusFault(raw, f"Explore needs at least one keyword: {_preview(raw)}")
    return Explore(reason=_text_of(values["reason"]), handle=handle, keywords=tuple(keywords))


def _text_of(value: str | list[str]) -> str:
    return ", ".join(value) if isinstance(value, list) else value.strip()


def _preview(raw: str, limit: int = 120) -> str:
    return raw if len(raw) <= limit else raw[: limit - 1] + "…"
