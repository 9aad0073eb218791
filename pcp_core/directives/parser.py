"""An incremental parser of worker directives (§7.3) in a reply, streamed or whole.

``DirectiveParser`` is fed chunks as they stream in (``feed``) and called when the
reply ends (``flush``). It is a small character-level state machine: every
character is looked at once, so parsing is linear, and the events are the same
whatever the chunking. Text is released as soon as it cannot be the start of a
directive (``vocabulary.NAMES``) or of a tag of the document (``Markup``).
"""

from __future__ import annotations

import re

from ..prompt.markup import TAGS, unescaped
from ..prompt.scaffolding import without_scaffolding
from .vocabulary import MAX_DIRECTIVE_CHARS, NAMES, BusFault, Consult, Directive, Event, Explore, Markup, Shelve, Text, Value, bind

__all__ = ["DirectiveParser", "parse_directives"]

_NAME_START = re.compile("[CES<]")  # first letters of NAMES, and a tag's "<": the only places text can be held
_PREFIXES = frozenset(name[:i] for name in NAMES for i in range(1, len(name) + 1))
# The document's tags, opening or closing: "<Node", "</Content"; and the root as a small model misremembers it.
ECHOED_TAGS = ("PageContext", "Paged_Context")
_TAG_NAMES = frozenset(opening + tag for tag in (*TAGS, *ECHOED_TAGS) for opening in ("<", "</"))
_TAG_PREFIXES = frozenset(name[:i] for name in _TAG_NAMES for i in range(1, len(name) + 1))
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_GAP_CHARS = " \t"  # allowed between a name and "(": not newlines, so prose lines are not joined
_ESCAPABLE = "\"'\\"

# Parser states. Outside a directive: text, a possible name, a name waiting for "(",
# a possible tag, a tag read up to its ">".
_TEXT, _NAME, _GAP, _TAG, _IN_TAG = "text", "name", "gap", "tag", "in_tag"
# Inside "( … )": before a value, in a bare value, in a quote, after a backslash,
# after a closed quote or list.
_ARG, _BARE, _QUOTED, _ESCAPE, _AFTER = "arg", "bare", "quoted", "escape", "after"


class DirectiveParser:
    """Split a streamed reply into ``Text``, directive and ``BusFault`` events."""

    def __init__(self, max_chars: int = MAX_DIRECTIVE_CHARS) -> None:
        self.max_chars = max_chars
        self._events: list[Event] = []
        self._text: list[str] = []  # text not yet handed out
        self._before = ""  # last character before the current position: "re" + "Consult(" is no directive
        self._state = _TEXT
        self._held = ""  # a name prefix, or a name and its gap, not yet known to be text
        self._reset_directive("")
        self._handlers = {_ARG: self._on_arg, _BARE: self._on_bare, _QUOTED: self._on_quoted, _ESCAPE: self._on_escape, _AFTER: self._on_after}

    # -- public ------------------------------------------------------------------

    def feed(self, chunk: str) -> list[Event]:
        """Events completed by ``chunk``; text is held only while it may start a directive."""
        i = 0
        while i < len(chunk):
            if self._state == _TEXT:
                i = self._scan_text(chunk, i)
            elif self._step(chunk[i]):
                i += 1
        return self._take()

    def flush(self) -> list[Event]:
        """The reply ended: release held text, fault an unfinished directive, start afresh."""
        if self._state in (_NAME, _GAP, _TAG):
            self._release_held()
        elif self._state == _IN_TAG:  # a tag cut off by the end of the reply is still markup
            self._end_tag()
        elif self._state != _TEXT:
            self._fault(self._unfinished_reason())
        self._before = ""
        return self._take()

    # -- text and names ------------------------------------------------------------

    def _scan_text(self, chunk: str, i: int) -> int:
        """Emit plain text up to the next possible directive name; return where it stops."""
        for match in _NAME_START.finditer(chunk, i):
            at = match.start()
            if chunk[at] == "<" or not _is_word(chunk[at - 1] if at > i else self._before):
                self._emit_text(chunk[i:at])
                self._state = _TAG if chunk[at] == "<" else _NAME
                return at
        self._emit_text(chunk[i:])
        return len(chunk)

    def _step(self, ch: str) -> bool:
        """Consume one character outside plain text; False if it must be read again as text."""
        if self._state == _NAME:
            return self._step_name(ch)
        if self._state == _GAP:
            return self._step_gap(ch)
        if self._state == _TAG:
            return self._step_tag(ch)
        if self._state == _IN_TAG:
            return self._step_in_tag(ch)
        self._step_directive(ch)
        return True

    def _step_name(self, ch: str) -> bool:
        """Read a character that may go on a directive's name; False when the name is broken off as text."""
        if self._held + ch not in _PREFIXES:
            self._release_held()
            return False
        self._held += ch
        if self._held in NAMES:
            self._state = _GAP  # a whole name: it must now be followed by "("
        return True

    def _step_gap(self, ch: str) -> bool:
        """Read a character between a directive's name and its opening parenthesis."""
        if ch == "(":
            self._reset_directive(self._held.rstrip(_GAP_CHARS))
            self._raw = [self._held, ch]
            self._raw_len = len(self._held) + 1
            self._held, self._state = "", _ARG
            return True
        if ch in _GAP_CHARS and len(self._held) < self.max_chars:
            self._held += ch
            return True
        self._release_held()  # "Consultation", "Consult the page": prose
        return False

    def _step_tag(self, ch: str) -> bool:
        """Read a character that may go on a tag of the document's markup."""
        if self._held in _TAG_NAMES and (ch.isspace() or ch in "/>"):
            self._state = _IN_TAG  # "<Node" and a space: the document's tag, whatever its attributes
            return self._step_in_tag(ch)
        if self._held + ch not in _TAG_PREFIXES:
            self._release_held()  # "<b>", "a < b", "<Nodes>": text
            return False
        self._held += ch
        return True

    def _step_in_tag(self, ch: str) -> bool:
        """Read a character inside a tag, up to its closing ``>``."""
        self._held += ch
        if ch == ">":
            self._end_tag()
        elif len(self._held) >= self.max_chars:  # no ">" in sight: it was text after all
            self._release_held()
        return True

    def _end_tag(self) -> None:
        """The tag held is whole: hand it out as ``Markup``."""
        self._emit(Markup(self._held))
        self._before = self._held[-1]
        self._held, self._state = "", _TEXT

    def _release_held(self) -> None:
        """What was held as a possible name or tag is text after all: release it."""
        self._emit_text(self._held)
        self._held = ""
        self._state = _TEXT

    # -- inside "( … )" ---------------------------------------------------------------

    def _reset_directive(self, name: str) -> None:
        """Start reading the directive ``name``: no arguments yet."""
        self._name = name
        self._raw = []
        self._raw_len = 0
        self._args: list[tuple[str | None, Value]] = []  # (keyword or None, value)
        self._key: str | None = None
        self._chars: list[str] = []  # the value being read
        self._quoted = False  # the value was quoted: keep it verbatim, do not trim
        self._quote = ""
        self._items: list[str] | None = None  # the items while inside a [list]
        self._list_value: tuple[str, ...] | None = None  # a closed [list], until its "," or ")"
        self._depth = 0  # nested "(" in a bare value: its ")" is text, not the end
        self._error = ""  # a syntax problem seen on the way, reported at the end

    def _step_directive(self, ch: str) -> None:
        """Read one character inside a directive's parentheses; fault it when it runs on too long."""
        self._raw.append(ch)
        self._raw_len += 1
        if self._handlers[self._state](ch):
            self._finish()
        elif self._raw_len >= self.max_chars:
            self._fault(f"{self._name} was not closed within {self.max_chars} characters")

    # Each handler returns True when ch closed the directive.

    def _on_arg(self, ch: str) -> bool:
        """Read a character where an argument may start; True when the directive ends."""
        if ch.isspace():
            return False
        if ch in "\"'":
            self._quote, self._state = ch, _QUOTED
            return False
        if ch == "[" and self._items is None:
            self._items = []
            return False
        if ch == "]" and self._items is not None:
            self._close_list()
            return False
        if ch == ")" and not self._args and self._key is None and self._items is None:
            return True  # Consult(): no arguments at all
        if ch in ",)":
            return self._end_value(ch)  # an empty argument, e.g. Consult(a, )
        self._state = _BARE
        return self._on_bare(ch)

    def _on_bare(self, ch: str) -> bool:
        """Read a character of an unquoted argument; True when the directive ends."""
        if self._depth == 0 and ch in ",)":
            return self._end_value(ch)
        if ch == "]" and self._items is not None:
            self._close_list()
            return False
        if ch == "=" and self._key is None and self._items is None and _IDENTIFIER.match("".join(self._chars).strip()):
            self._key, self._chars, self._state = "".join(self._chars).strip(), [], _ARG
            return False
        if self._items is None:  # balanced parentheses belong to a bare value: "(approx)"
            self._depth += (ch == "(") - (ch == ")")
        self._chars.append(ch)
        return False

    def _on_quoted(self, ch: str) -> bool:
        """Read a character inside a quoted argument."""
        if ch == "\\":
            self._state = _ESCAPE
        elif ch == self._quote:
            self._quoted, self._state = True, _AFTER
        else:
            self._chars.append(ch)
        return False

    def _on_escape(self, ch: str) -> bool:
        """Read the character after a backslash in a quoted argument."""
        self._chars.append(ch if ch in _ESCAPABLE else "\\" + ch)  # other escapes stay as written
        self._state = _QUOTED
        return False

    def _on_after(self, ch: str) -> bool:
        """Read a character after a quoted argument or a list; True when the directive ends."""
        if ch.isspace():
            return False
        if ch in ",)":
            return self._end_value(ch)
        if ch == "]" and self._items is not None:
            self._close_list()
            return False
        self._error = self._error or f"{self._name} has text after a closing quote or ]"
        self._state = _BARE
        return self._on_bare(ch)

    def _end_value(self, ch: str) -> bool:
        """A "," or ")" ended the current value or list item; True if it ended the directive."""
        if self._items is not None:
            self._items.append(self._value())
            if ch == ",":
                self._state = _ARG
                return False
            self._error = self._error or f"{self._name} has a [ list without its ]"
            self._close_list()
        text = self._value()
        self._args.append((self._key, text if self._list_value is None else self._list_value))
        self._key, self._list_value, self._state = None, None, _ARG
        return ch == ")"

    def _close_list(self) -> None:
        """A ``[list]`` argument closes: its items become the argument's value."""
        assert self._items is not None
        if self._chars or self._quoted:
            self._items.append(self._value())
        self._list_value, self._items, self._state = tuple(self._items), None, _AFTER

    def _value(self) -> str:
        """Take the value read so far: quoted text verbatim, bare text trimmed."""
        text = "".join(self._chars)
        value = text if self._quoted else text.strip()
        self._chars, self._quoted, self._depth = [], False, 0
        return value

    # -- results ---------------------------------------------------------------------

    def _finish(self) -> None:
        """The directive's closing parenthesis: bind its arguments, or fault it."""
        raw = "".join(self._raw)
        result = self._error or bind(self._name, self._args)
        if isinstance(result, str):
            self._emit(BusFault(raw, f"{result}: {_preview(raw)}"))
        else:
            self._emit(result)
        self._end_directive(raw)

    def _fault(self, problem: str) -> None:
        """Fault the directive being read with ``problem``, and go back to text."""
        raw = "".join(self._raw)
        self._emit(BusFault(raw, f"{problem}: {_preview(raw)}"))
        self._end_directive(raw)

    def _end_directive(self, raw: str) -> None:
        """Go back to text after the directive ``raw``."""
        self._before = raw[-1]
        self._reset_directive("")
        self._state = _TEXT

    def _unfinished_reason(self) -> str:
        """Why the directive being read is unfinished when the reply ends."""
        if self._state in (_QUOTED, _ESCAPE):
            return f"{self._name} has an unterminated quote (no closing {self._quote}) and the reply ended"
        if self._items is not None and self._state != _AFTER:
            return f"{self._name} has a [ list without its ] and the reply ended"
        return f"{self._name} is missing its closing ) and the reply ended"

    def _emit_text(self, text: str) -> None:
        """Hold ``text`` to be handed out as one ``Text`` event."""
        if text:
            self._text.append(text)
            self._before = text[-1]

    def _emit(self, event: Event) -> None:
        """Hand out ``event``, after the text before it."""
        self._flush_text()
        self._events.append(event)

    def _flush_text(self) -> None:
        """Hand out the text held so far as one ``Text`` event."""
        if self._text:
            self._events.append(Text("".join(self._text)))
            self._text = []

    def _take(self) -> list[Event]:
        """The events read so far, handed over once."""
        self._flush_text()
        events, self._events = self._events, []
        return events


def parse_directives(text: str) -> tuple[str, list[Directive], list[BusFault]]:
    """Parse a whole reply, the document's escaping undone (``markup.unescaped``): its text without directives (nor the prompt's own
    sentences, ``scaffolding``), the directives, the faults."""
    parser = DirectiveParser()
    events = parser.feed(unescaped(text)) + parser.flush()
    clean = without_scaffolding("".join(e.text for e in events if isinstance(e, Text)))
    directives: list[Directive] = [e for e in events if isinstance(e, Consult | Explore | Shelve)]
    return clean, directives, [e for e in events if isinstance(e, BusFault)]


# -- binding arguments to fields ---------------------------------------------------------


def _is_word(ch: str) -> bool:
    """Whether ``ch`` may be part of a word (so a directive's name right after it is no directive)."""
    return ch.isalnum() or ch == "_"


def _preview(raw: str, limit: int = 160) -> str:
    """``raw`` cut to ``limit`` characters, for a fault's reason."""
    return raw if len(raw) <= limit else raw[: limit - 1] + "…"
