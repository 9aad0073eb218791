"""How a session is laid out in a store: a record, its parts, and the digests that find it by its transcript.

* ``("session", namespace, id)`` → the session's record (msgpack): what is
  small of it and of its pages (dates, term counts, topics), and the digests
  of the parts that hold the rest;
* ``("part", namespace, id, list, n)`` → the ``n``-th run of ``PART_ITEMS``
  pages (``LINK_PART_ITEMS`` links) of one of the session's long lists: its
  chain and first-seen times, and its pages (leaves, containers, blocks,
  solidified pages). A follow-up adds to the ends of those lists and
  changes its history's last pages; what came before stays as it was. So
  it writes the parts it changed and its record, not the whole session
  again. The record holds a digest of every part, so a session whose parts
  do not match it is not found (it is paged again), never read half old
  and half new;
* ``("version", namespace, id)`` → the token of the session's last write:
  a write names the token it replaces, and loses if another came first;
* ``("link", namespace, link)`` → the id of the session that link belongs to;
* ``("asked", namespace, link)`` → the id of the session whose last question
  (``Session.asked``) opens with that link: which of the branches of one history
  a follow-up goes on in;
* ``(TRANSCRIPTS, namespace, digest)`` → the id of the session whose messages
  have that transcript digest, and its chain's last link: how a process that
  has not seen a conversation finds the session a follow-up continues
  without hashing the whole history (``prefix_digests``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from pcp_core import PagedHistory, Session

from .sealing import Sealer

__all__ = ["TRANSCRIPTS", "KnownParts", "Layout", "Parts", "Record", "digest", "prefix_digests", "transcript_digest"]

# The first part of a transcript digest's key: the name stored sessions were written under, kept so that they are found.
TRANSCRIPTS = "said"

PART_ITEMS = 32  # pages (or blocks) per part
LINK_PART_ITEMS = 256  # links (or first-seen times) per part: short strings, and many
# The lists stored in parts, the session's own and its pages'; the rest stays in its record.
SESSION_PARTED = ("chain", "seen_at")
PAGES_PARTED = ("leaves", "containers", "blocks", "storage")
_PART_DECODERS = {
    f.name: msgspec.msgpack.Decoder(f.type)
    for struct, names in ((Session, SESSION_PARTED), (PagedHistory, PAGES_PARTED))
    for f in msgspec.structs.fields(struct)
    if f.name in names
}
PartKey = tuple[str, str, str, str, int]  # ("part", namespace, session id, list, n)
_SEPARATOR = "\x1f"


class Parts(msgspec.Struct, frozen=True):
    """How a session is cut into parts: items per part, and the session's own lists kept in parts
    (with none, its chain and first-seen times stay in its record, as before they were parted)."""

    part_items: int = PART_ITEMS
    link_part_items: int = LINK_PART_ITEMS
    session_parted: tuple[str, ...] = SESSION_PARTED


class Record(msgspec.Struct):
    """A session as stored: its parted lists empty, and the digests of their parts.

    A record written before the chain was parted holds its chain itself, and
    no digests for it: it reads back as it is.
    """

    session: Session
    parts: dict[str, list[str]]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)


def digest(raw: bytes) -> str:
    """The digest of a part's bytes."""
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def context(key: tuple[str | int, ...]) -> str:
    """What a sealed value is bound to: its key, so it opens nowhere else."""
    return _SEPARATOR.join(map(str, key))


class KnownParts:
    """What this process last wrote or read at each part's key (the most recent ``size``).

    A follow-up's pages are mostly the very objects of the request before it,
    and its chain the same links: a part of equal items decodes to the same
    items, so it is neither encoded nor written again. Comparing starts with
    identity, so the same objects cost no more than a pointer each. (A write
    that skips a part is conditional on the version this process read or
    wrote, whose parts these are: another process's write makes it lose.)
    """

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[PartKey, tuple[str, list[object]]] = OrderedDict()
        self._ends: OrderedDict[tuple[str, ...], int] = OrderedDict()  # per list, one past the last part known
        self._lock = threading.Lock()  # the writer adds, a request reading a session back too

    def digest(self, key: PartKey, part: list[object]) -> str | None:
        """The digest stored at ``key``, if it was stored for items equal to these."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[1] != part:
                return None
            self._entries.move_to_end(key)
        return entry[0]

    def add(self, key: PartKey, part: list[object], digest: str) -> None:
        """Note a part the store holds now, with its digest."""
        with self._lock:
            self._entries[key] = (digest, part)
            self._entries.move_to_end(key)
            self._ends[key[:4]] = max(self._ends.get(key[:4], 0), key[4] + 1)
            self._ends.move_to_end(key[:4])
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
            while len(self._ends) > self.size:
                self._ends.popitem(last=False)

    def trimmed(self, first: PartKey) -> None:
        """The parts of a list from ``first`` on were deleted (a session rebuilt shorter): none of them is known any more."""
        # A list with no end known has no part known: every add touches its end, and as many ends are kept as parts.
        with self._lock:
            end = self._ends.get(first[:4], 0)
            for n in range(first[4], end):
                self._entries.pop((*first[:4], n), None)
            if end > first[4]:
                self._ends[first[:4]] = first[4]


class Layout:
    """Sessions to the values a store keeps (sealed), and back."""

    def __init__(self, sealer: Sealer, known: KnownParts, parts: Parts = Parts()):
        self.sealer = sealer
        self.known = known
        self.parts = parts

    def writes(self, namespace: str, session: Session) -> tuple[dict[Any, bytes], list[PartKey], list[PartKey], dict[PartKey, tuple[list[object], str]]]:
        """What keeping ``session`` writes: its record and the parts that changed (sealed), the first
        part of each list past its end (trimmed), the parts left as they are, and the new parts' items."""
        pages = session.pages
        lists = _lists(session, pages, self.parts.session_parted)
        digests: dict[str, list[str]] = {}
        writes: dict[Any, bytes] = {}
        new: dict[PartKey, tuple[list[object], str]] = {}
        kept: list[PartKey] = []
        for name, items in lists.items():
            size = self.parts.link_part_items if name in SESSION_PARTED else self.parts.part_items
            digests[name] = []
            for i in range(0, len(items), size):
                key: PartKey = ("part", namespace, session.id, name, i // size)
                part = items[i : i + size]
                known = self.known.digest(key, part)
                if known is None:
                    raw = _encoder.encode(part)
                    known = digest(raw)
                    writes[key] = self.sealer.seal(raw, context(key))
                    new[key] = (part, known)
                else:
                    kept.append(key)
                digests[name].append(known)
        bare = _with_lists(session, pages, {name: [] for name in lists})
        record_key = ("session", namespace, session.id)
        writes[record_key] = self.sealer.seal(_encoder.encode(Record(session=bare, parts=digests)), context(record_key))
        trims: list[PartKey] = [("part", namespace, session.id, name, len(digests[name])) for name in lists]
        return writes, trims, kept, new

    def record(self, key: tuple[str, ...], raw: bytes | None) -> Record | None:
        """The record stored at ``key``; None if there is none, it does not open, or another version wrote it."""
        opened = None if raw is None else self.sealer.open(raw, context(key))
        if opened is None:
            return None
        try:
            return _decoder.decode(opened)
        except (msgspec.DecodeError, msgspec.ValidationError):  # written by an incompatible version: page afresh
            return None

    def part_keys(self, namespace: str, record: Record) -> list[PartKey] | None:
        """The keys of a record's parts; None: a part this version does not read."""
        if any(name not in _PART_DECODERS for name in record.parts):  # a list this version does not keep
            return None
        return [("part", namespace, record.session.id, name, n) for name, digests in record.parts.items() for n in range(len(digests))]

    def assemble(self, record: Record, keys: Sequence[PartKey], raws: Sequence[bytes | None]) -> Session | None:
        """The session of ``record`` with its parts (read at ``keys``) back in; None if one is gone or does not match."""
        lists: dict[str, list[object]] = {name: [] for name in record.parts}
        for key, raw in zip(keys, raws):
            opened = None if raw is None else self.sealer.open(raw, context(key))
            expected = record.parts[key[3]][key[4]]
            if opened is None or digest(opened) != expected:
                return None
            part = _PART_DECODERS[key[3]].decode(opened)
            self.known.add(key, part, expected)
            lists[key[3]] += part
        return _with_lists(record.session, record.session.pages, lists)


def prefix_digests(text: bytes, messages: Sequence[Mapping[str, Any]], last: int) -> list[tuple[int, str]]:
    """The transcript digests of the conversation's longest prefixes (``last`` at most), longest first, each with its length.

    ``text`` is the messages' transcript, ``[`` + each message's canonical
    JSON, comma-separated, + ``]``: a prefix's transcript is ``text`` cut
    after one of its messages, closed by ``]``. Only the last messages are
    encoded alone, to find where they start; the bytes are hashed once.
    """
    n = len(messages)
    ends = [len(text) - 1]
    for message in reversed(messages[max(n - last, 1) :]):
        ends.append(ends[-1] - len(msgspec.json.encode(message, order="sorted")) - 1)
    ends.reverse()  # ends[i] closes the prefix of n - len(ends) + 1 + i messages
    first = n - len(ends) + 1
    view = memoryview(text)
    running = hashlib.blake2b(digest_size=16)
    done = 0
    found = []
    for i, end in enumerate(ends):
        running.update(view[done:end])
        done = end
        closed = running.copy()
        closed.update(b"]")
        found.append((first + i, closed.hexdigest()))
    return found[::-1]


def transcript_digest(text: bytes) -> str:
    """The digest a session's transcript is found by (``prefix_digests`` of a follow-up's history)."""
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def _lists(session: Session, pages: PagedHistory, session_parted: Sequence[str]) -> dict[str, list[object]]:
    """The lists of ``session`` (with ``pages``) that are stored in parts, by name."""
    return {**{name: getattr(session, name) for name in session_parted}, **{name: getattr(pages, name) for name in PAGES_PARTED}}


def _with_lists(session: Session, pages: PagedHistory, lists: dict[str, list[object]]) -> Session:
    """``session`` with ``pages``, and the parted lists named in ``lists`` in place of its own."""
    own = {name: items for name, items in lists.items() if name in SESSION_PARTED}
    paged = {name: items for name, items in lists.items() if name in PAGES_PARTED}
    return msgspec.structs.replace(session, **own, pages=msgspec.structs.replace(pages, **paged))
