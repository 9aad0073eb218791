"""Chat bodies the proxy read last, so that a follow-up decodes and counts only the messages it adds.

A chat client resends its whole conversation on every call, encoded the same
way: a follow-up's body opens with the very bytes of the one before it, up to
the end of its last message, and goes on with its new messages (``, {…}, {…}]``)
and the fields after them. Bytes equal up to there mean equal messages (the
JSON before that point parses the same), so those messages are not decoded
again: their dicts are the ones the earlier read made, and their tokens its
count. Only a body made of the earlier one's head (up to its messages' ``[``)
and what comes after the known messages is decoded: the new messages and every
other field, checked as a whole body is. A body that does not continue a known
one is read whole, as before.

Bounded by bytes (an estimate of the body's bytes and the decoded messages),
least recently used first; one body kept per conversation (the one a follow-up
extended replaces it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from pcp_core import CountText, prompt_tokens
from pcp_core.text.tokens import REPLY_PRIMING

from ..errors import ClientError
from .codec import Reading

__all__ = ["KnownBodies"]

# What a body's decoded messages hold, as a multiple of its bytes: a dict (~180 bytes) and its strings per message.
DECODED_PER_BYTE = 3
ENTRIES = 256  # bodies kept at most, whatever their size
# Bodies below this are read whole, as they always were, and not kept: decoding one takes well under a
# millisecond, and finding where its messages end would cost a request sent untouched more than it saves.
SMALLEST = 256 * 1024
FIRST_KEYS = 4  # "messages" keys tried when finding where a body's messages start (one of a nested object may come first)


class _Messages(msgspec.Struct):
    messages: msgspec.Raw = msgspec.Raw(b"")  # the array as the body holds it: its length locates its end


_ARRAY = msgspec.json.Decoder(_Messages)


class _Known(NamedTuple):
    head: bytes  # the body up to its messages' closing bracket (not included)
    start: int  # where the messages' array opens (its "[")
    messages: list[dict[str, Any]]
    tokens: int  # the messages' tokens (``prompt_tokens`` less the reply's priming)

    @property
    def size(self) -> int:
        """Bytes this entry keeps resident: its head, and what was decoded of it."""
        return len(self.head) * (1 + DECODED_PER_BYTE)


class KnownBodies:
    """``read``: a chat body as ``read_whole`` reads it, and its messages' tokens; a follow-up's known messages reused."""

    def __init__(self, read_whole: Callable[[bytes], Reading], max_bytes: int, entries: int = ENTRIES, smallest: int = SMALLEST):
        self.read_whole = read_whole
        self.max_bytes = max_bytes
        self.entries = entries
        self.smallest = smallest
        self.resident_bytes = 0
        # By a number of their own: a head of megabytes is not hashed as a key, on every follow-up.
        self._known: OrderedDict[int, _Known] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()  # bodies are read in threads

    def read(self, body: bytes, count: CountText) -> tuple[Reading, int]:
        """The request as ``read_whole`` reads it, and its messages' ``prompt_tokens``."""
        if len(body) < self.smallest or not self.max_bytes:
            reading = self.read_whole(body)
            return reading, prompt_tokens(reading.messages, count)
        continued = self._continued(body)
        if continued is not None:
            read = self._read_after(*continued, body, count)
            if read is not None:
                return read
        reading = self.read_whole(body)
        tokens = prompt_tokens(reading.messages, count)
        if reading.unreadable is None:
            self._remember(None, _located(body, reading.messages, tokens - REPLY_PRIMING))
        return reading, tokens

    def _continued(self, body: bytes) -> tuple[int, _Known] | None:
        """The longest known body whose messages ``body`` opens with, and its number."""
        with self._lock:
            found = [(n, known) for n, known in self._known.items() if len(known.head) < len(body) and body.startswith(known.head)]
        return max(found, key=lambda entry: len(entry[1].head), default=None)

    def _read_after(self, number: int, known: _Known, body: bytes, count: CountText) -> tuple[Reading, int] | None:
        """``body`` read as ``known``'s messages and what follows them; None when that is not a body of its own
        (another shape after them, or a fault whose 400 must name the whole body's place: read whole)."""
        at = _skip_space(body, len(known.head))
        after = body[at : at + 1]
        if after not in (b",", b"]"):
            return None
        cut = at + 1 if after == b"," else at
        rest = body[: known.start + 1] + body[cut:]  # the head's fields, the new messages, the fields after them
        try:
            reading = self.read_whole(rest)
            array = _ARRAY.decode(rest).messages
        except (ClientError, msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            return None
        if reading.unreadable is not None or not rest.startswith(bytes(array), known.start):  # another "messages" key decoded
            return None
        new = reading.messages
        messages = [*known.messages, *new]
        tokens = known.tokens + prompt_tokens(new, count)
        # The array's closing bracket in ``body``: where it is in ``rest``, moved by what ``rest`` left out.
        close = known.start + len(array) - 1 - (known.start + 1) + cut
        self._remember(number, _Known(body[:close].rstrip(_SPACE), known.start, messages, tokens - REPLY_PRIMING))
        decoded = {**reading.decoded, "messages": messages} if "messages" in reading.decoded else reading.decoded
        return msgspec.structs.replace(reading, messages=messages, decoded=decoded, rest=rest), tokens

    def _remember(self, replaced: int | None, known: _Known | None) -> None:
        """Keep ``known`` (dropping ``replaced``), then drop the oldest entries past the byte and entry limits."""
        with self._lock:
            if replaced is not None and replaced in self._known:
                self.resident_bytes -= self._known.pop(replaced).size
            if known is None or known.size > self.max_bytes:
                return
            for n, other in list(self._known.items()):  # the same head read twice (two requests at once) is kept once
                if len(other.head) == len(known.head) and other.head == known.head:
                    self.resident_bytes -= self._known.pop(n).size
            self._next += 1
            self._known[self._next] = known
            self.resident_bytes += known.size
            while self.resident_bytes > self.max_bytes or len(self._known) > self.entries:
                self.resident_bytes -= self._known.popitem(last=False)[1].size


def _located(body: bytes, messages: list[dict[str, Any]], tokens: int) -> _Known | None:
    """``body``'s messages as a follow-up may reuse them: where its array opens and closes; None when that is not found."""
    try:
        array = _ARRAY.decode(body).messages
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return None
    if len(array) <= 2:  # no messages: nothing a follow-up would reuse
        return None
    at, raw = 0, bytes(array)
    for _ in range(FIRST_KEYS):
        at = body.find(b'"messages"', at)
        if at < 0:
            return None
        at += len(b'"messages"')
        colon = _skip_space(body, at)
        start = _skip_space(body, colon + 1) if body[colon : colon + 1] == b":" else -1
        if start >= 0 and body.startswith(raw, start):  # the array the decoder read
            if body.find(raw, start + 1) >= 0:  # there twice (a nested "messages" key first): which one was read is not known
                return None
            return _Known(body[: start + len(array) - 1].rstrip(_SPACE), start, messages, tokens)  # up to its last message's end
    return None


_SPACE = b" \t\n\r"  # JSON's whitespace


def _skip_space(body: bytes, at: int) -> int:
    """The index of the first byte at or after ``at`` that is not JSON whitespace."""
    while at < len(body) and body[at] in _SPACE:
        at += 1
    return at
