"""Worker directives (§7.3): what the worker may ask for, and how a call's arguments bind to one.

``Consult(reason, id)``, ``Explore(reason, handle, keywords)`` and
``Shelve(reason, id)`` may appear anywhere in a reply, several at a time, with
arguments quoted (``"…"`` or ``'…'``, backslash escapes) or bare, positional
or as ``name=value``. Everything else is text.

A tag of the ``<PagedContext>`` document the worker echoes (``<Node id=…>``,
``</Content>``) is ``Markup``: like a directive, it never reaches the client.
A directive that cannot be read is a ``BusFault`` (§2.4) whose reason is
written for the model that has to fix it. The parser is ``parser``.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "MAX_DIRECTIVE_CHARS",
    "BusFault",
    "Consult",
    "Directive",
    "Event",
    "Explore",
    "FIELDS",
    "KINDS",
    "Markup",
    "NAMES",
    "Shelve",
    "Text",
    "Value",
    "bind",
]

# A directive still open after this many characters is a runaway: fault it and
# let the text flow again, so a broken reply cannot make the parser hold text forever.
MAX_DIRECTIVE_CHARS = 2000


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


class Text(msgspec.Struct, frozen=True, tag=True):
    text: str


class BusFault(msgspec.Struct, frozen=True, tag=True):
    raw: str  # the directive text as the model wrote it
    reason: str  # what was wrong, addressed to the model


class Markup(msgspec.Struct, frozen=True, tag=True):
    """A tag of the PagedContext document (§9.2) echoed in a reply: protocol, not answer."""

    raw: str


Directive = Consult | Explore | Shelve
Event = Text | Consult | Explore | Shelve | BusFault | Markup

KINDS: dict[str, type[Directive]] = {kind.__name__: kind for kind in (Consult, Explore, Shelve)}
NAMES = tuple(KINDS)
# Each directive's arguments, in the order a call gives them positionally: its fields', declared once above.
FIELDS: dict[str, tuple[str, ...]] = {name: kind.__struct_fields__ for name, kind in KINDS.items()}
Value = str | tuple[str, ...]  # an argument: text, or a [list] of texts


def bind(name: str, args: list[tuple[str | None, Value]]) -> Directive | str:
    """The directive the arguments make, or what is wrong with them."""
    fields = FIELDS[name]
    signature = f"({', '.join(fields)})"
    for key, _ in args:
        if key is not None and key not in fields:
            return f"{name} has no argument named {key!r}; it takes {signature}"
    if name == "Explore" and len(args) < 3:
        return f"Explore needs at least 3 arguments {signature}, got {len(args)}"
    if name != "Explore" and len(args) != 2:
        return f"{name} needs 2 arguments {signature}, got {len(args)}"
    positional = [value for key, value in args if key is None]
    if name == "Explore" and len(positional) > 3:  # Explore(r, h, "a", "b"): the rest are keywords
        positional[2:] = [tuple(k for value in positional[2:] for k in _as_items(value))]
    values: dict[str, Value] = dict(zip(fields, positional))
    for key, value in args:
        if key is not None:
            if key in values:
                return f"{name} got two values for {key}"
            values[key] = value
    return _make(name, values)


def _make(name: str, values: dict[str, Value]) -> Directive | str:
    """The directive of the bound ``values``, or what is wrong with them."""
    for field in FIELDS[name]:
        if field != "keywords" and not isinstance(values[field], str):
            return f"{name} needs {field} as text, not a [list]"
    text = {field: value for field, value in values.items() if isinstance(value, str)}  # every field but keywords, as checked
    target_field = "handle" if name == "Explore" else "id"
    target = text[target_field].strip()
    if not target:
        return f"{name} needs a non-empty {target_field}"
    if name != "Explore":
        kind = Consult if name == "Consult" else Shelve
        return kind(reason=text["reason"], id=target)
    keywords = tuple(k.strip() for item in _as_items(values["keywords"]) for k in item.split(",") if k.strip())
    if not keywords:
        return "Explore needs at least one keyword"
    return Explore(reason=text["reason"], handle=target, keywords=keywords)


def _as_items(value: Value) -> tuple[str, ...]:
    """An argument as a tuple of texts, whether it was one text or a list."""
    return (value,) if isinstance(value, str) else value
