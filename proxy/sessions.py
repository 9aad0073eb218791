"""Where sessions live: diskcache in the data dir, with the recent ones kept in memory.

Keys are namespaced by the caller (a hash of its key), so one caller can neither
find nor pin another's session. Three kinds of entries:

* ``("session", namespace, id)`` → the session's record (msgpack): what is
  small of it and of its pages (dates, term counts, topics), and the digests
  of the parts that hold the rest;
* ``("part", namespace, id, list, n)`` → the ``n``-th run of ``PART_ITEMS``
  pages (``LINK_PART_ITEMS`` links) of one of the session's long lists: its chain
  and first-seen times, and its pages (leaves, containers, blocks,
  solidified pages). A follow-up adds to the ends of those lists and
  changes its history's last pages; what came before stays as it was. So
  it writes the parts it changed and its record, not the whole session
  again. The record holds a digest of every part, so a session whose parts
  do not match it is not found (it is paged again), never read half old
  and half new;
* ``("link", namespace, link)`` → the id of the session that link belongs to.

A link can outlive its session's knowledge of it (the session was rebuilt after
an edit, or evicted); every lookup checks the link against the session's chain.
A session one of whose parts is gone (culled) or does not match is not found: it
is paged again.
Writes go through one background thread, in order, so a follow-up never waits
on the disk; a lookup that must read links first waits for the writes queued
before it, and ``close()`` finishes them.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import diskcache
import msgspec

from pcp_core import Conversation, PagedHistory, Resolution, Session, begins_with, chain_links, common_prefix, transcript

from .datadir import private_tree
from .sealing import Sealer

__all__ = ["SessionStore"]

log = logging.getLogger("pcp.sessions")

RECENT = 64  # sessions kept decoded in memory
# Links go to disk for the first LINK_STRIDE messages, every LINK_STRIDE-th
# after them and a session's last one: a 200k-token history's first write is
# some 300 entries, not 5,000. A lookup probes the last LINK_STRIDE positions
# (where a follow-up's known end lies) and every stored position before them;
# the session's full chain then gives the exact common prefix.
LINK_STRIDE = 16
PART_ITEMS = 32  # pages (or blocks) per part
LINK_PART_ITEMS = 256  # links (or first-seen times) per part: short strings, and many
# The parts this process wrote or read last, with their items: a part that holds
# equal items is not encoded again. Bounded: it keeps those items alive.
KNOWN_PARTS = 4096
# The lists stored in parts, the session's own and its pages'; the rest stays in its record.
SESSION_PARTED = ("chain", "seen_at")
PAGES_PARTED = ("leaves", "containers", "blocks", "storage")
_PART_DECODERS = {f.name: msgspec.msgpack.Decoder(f.type) for struct, names in ((Session, SESSION_PARTED), (PagedHistory, PAGES_PARTED)) for f in msgspec.structs.fields(struct) if f.name in names}
PartKey = tuple[str, str, str, str, int]  # ("part", namespace, session id, list, n)


class _StringKeys(diskcache.Disk):
    """Keys (tuples of strings, and a part's number) kept as one string.

    diskcache pickles a tuple key and optimises the pickle in Python: ~0.2 ms
    a key, holding the interpreter while a request computes.
    """

    def put(self, key: object) -> tuple[object, bool]:
        return super().put(_SEPARATOR.join(map(str, key)) if type(key) is tuple else key)  # type: ignore[no-any-return]

    def get(self, key: object, raw: bool) -> object:
        key = super().get(key, raw)
        if not isinstance(key, str) or _SEPARATOR not in key:
            return key
        fields: list[str | int] = list(key.split(_SEPARATOR))
        if fields[0] == "part":
            fields[-1] = int(fields[-1])
        return tuple(fields)


_SEPARATOR = "\x1f"


class _Record(msgspec.Struct):
    """A session as stored: its parted lists empty, and the digests of their parts.

    A record written before the chain was parted holds its chain itself, and
    no digests for it: it reads back as it is.
    """

    session: Session
    parts: dict[str, list[str]]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Record)


class SessionStore:
    def __init__(self, directory: Path, recent: int = RECENT, sealer: Sealer | None = None):
        private_tree(directory)
        self.sealer = sealer or Sealer()  # records and parts hold the conversation's text
        self.cache = diskcache.Cache(str(directory), disk=_StringKeys, cull_limit=0)
        self.recent: OrderedDict[tuple[str, str], Session] = OrderedDict()
        # The transcript of a recent session's messages, with the last link of the
        # chain it was taken for: how a follow-up finds it without a chain of its own.
        # A session kept since under another chain (a concurrent request's) does not match it.
        self.transcripts: dict[tuple[str, str], tuple[str, bytes]] = {}
        self.lock = threading.Lock()  # requests read ``recent`` from worker threads
        self.recent_size = recent
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcp-sessions")
        self.pending: Future[None] | None = None
        self.parts = _KnownParts(KNOWN_PARTS)

    # -- reading (blocking: call from a thread) -----------------------------------------
    def resolve(self, namespace: str, conversation: Conversation, pinned: str | None = None) -> Resolution:
        """The session the request's chained messages continue: the pinned one, or the longest known prefix's.

        A follow-up is found in memory by its history's transcript, and only
        its new messages are linked; otherwise the whole chain is linked and
        looked up, in memory and then on disk.
        """
        chained = conversation.chained
        if pinned is None:
            recent = self._continued(namespace, transcript(conversation.history))
            if recent is not None:
                n = len(recent.chain)
                return Resolution(found=recent, reused=n, links=[*recent.chain, *chain_links(chained[n:], after=recent.chain[-1])])
        links = chain_links(chained)
        history = links[: len(conversation.history)]
        if pinned is not None:
            found = self._load(namespace, pinned)
            return Resolution(found=found, reused=common_prefix(found.chain, history) if found else 0, links=links, pinned=pinned)
        found, reused = self._find(namespace, history)
        return Resolution(found=found, reused=reused, links=links)

    def stored(self) -> list[tuple[str, str]]:
        """(namespace, id) of every session on disk."""
        return [(key[1], key[2]) for key in self.cache.iterkeys() if key[0] == "session"]

    def read(self, namespace: str, session_id: str) -> Session | None:
        """The session, for a look inside (the inspector, the CLI): read without joining the recent ones."""
        return self._load(namespace, session_id, remember=False)

    def _load(self, namespace: str, session_id: str, remember: bool = True) -> Session | None:
        with self.lock:
            session = self.recent.get((namespace, session_id))
        if session is not None:
            return session
        raw = self._get(("session", namespace, session_id))
        if raw is None:
            return None
        try:
            session = self._assemble(namespace, _decoder.decode(raw))
        except (msgspec.DecodeError, msgspec.ValidationError):  # written by an incompatible version: page afresh
            return None
        if session is not None and remember:
            self._remember(namespace, session)
        return session

    def _assemble(self, namespace: str, record: _Record) -> Session | None:
        """The session of ``record`` with its parts read back; None if one is gone or does not match."""
        lists: dict[str, list[object]] = {}
        for name, digests in record.parts.items():
            decoder = _PART_DECODERS.get(name)
            if decoder is None:  # a list this version does not keep
                return None
            items: list[object] = []
            for n, digest in enumerate(digests):
                key = ("part", namespace, record.session.id, name, n)
                raw = self._get(key)
                if raw is None or _digest(raw) != digest:
                    return None
                part = decoder.decode(raw)
                self.parts.add(key, part, digest)
                items += part
            lists[name] = items
        return _with_lists(record.session, record.session.pages, lists)

    def _find(self, namespace: str, chain: list[str]) -> tuple[Session | None, int]:
        """The session holding the longest prefix of ``chain``, and that prefix's length."""
        extended = self._extended(namespace, chain)
        if extended is not None:
            return extended, len(extended.chain)
        # Links reach the disk in the background: a fork that comes right after
        # its parent must still find the parent's links.
        self.flush()
        for i in _probes(len(chain)):
            session_id = self.cache.get(("link", namespace, chain[i]))
            if session_id is None:
                continue
            session = self._load(namespace, session_id)
            if session is not None and i < len(session.chain) and session.chain[i] == chain[i]:
                return session, common_prefix(session.chain, chain)
        return None, 0

    def _extended(self, namespace: str, chain: list[str]) -> Session | None:
        """The longest recent session that ``chain`` extends: a follow-up, found without the disk."""
        best = None
        with self.lock:
            recent = list(self.recent.items())
        for (owner, _), session in recent:
            n = len(session.chain)
            if owner == namespace and 0 < n <= len(chain) and chain[n - 1] == session.chain[-1] and (best is None or n > len(best.chain)):
                best = session
        return best

    def _continued(self, namespace: str, said: bytes) -> Session | None:
        """The longest recent session whose messages the transcript ``said`` opens with: a follow-up, found without its chain."""
        best = None
        with self.lock:
            candidates = [(self.recent[key], known) for key, (last, known) in self.transcripts.items() if key[0] == namespace and self.recent[key].chain[-1:] == [last]]
        for session, known in candidates:
            if (best is None or len(session.chain) > len(best.chain)) and begins_with(said, known):
                best = session
        return best

    # -- writing --------------------------------------------------------------------------
    def save(self, namespace: str, session: Session, new_links: int, linked: list[dict] | None = None) -> None:
        """Keep ``session`` (its last ``new_links`` links are new); the disk write happens in the background.

        ``linked``: the messages its chain links, by whose transcript a follow-up finds it.
        """
        self._remember(namespace, session)
        self.pending = self.writer.submit(self._write, namespace, session, new_links, linked)

    def _write(self, namespace: str, session: Session, new_links: int, linked: list[dict] | None) -> None:
        if linked is not None:
            self._recognise(namespace, session, transcript(linked))
        try:
            n = len(session.chain)
            pages = session.pages
            lists = _lists(session, pages)
            digests: dict[str, list[str]] = {}
            new: dict[PartKey, tuple[list[object], bytes, str]] = {}  # the parts that changed, by key
            for name, items in lists.items():
                size = LINK_PART_ITEMS if name in SESSION_PARTED else PART_ITEMS
                digests[name] = [self._part(("part", namespace, session.id, name, i // size), items[i : i + size], new) for i in range(0, len(items), size)]
            bare = _with_lists(session, pages, {name: [] for name in lists})
            with self.cache.transact():
                for key, (_, raw, _) in new.items():
                    self.cache.set(key, self.sealer.seal(raw, _context(key)))
                for name in lists:  # a session rebuilt shorter leaves no parts behind
                    stale: PartKey = ("part", namespace, session.id, name, len(digests[name]))
                    while self.cache.delete(stale):
                        self.parts.forget(stale)
                        stale = (*stale[:4], stale[4] + 1)
                record_key = ("session", namespace, session.id)
                self.cache.set(record_key, self.sealer.seal(_encoder.encode(_Record(session=bare, parts=digests)), _context(record_key)))
                for i in _stored(n - new_links, n):
                    self.cache.set(("link", namespace, session.chain[i]), session.id)
            for key, (part, _, digest) in new.items():  # on disk now
                self.parts.add(key, part, digest)
            self.cache.cull()  # once per write, not once per entry (``cull_limit=0``)
        except Exception:  # a full disk costs the session's survival of a restart, not the request
            log.exception("session %s was not saved", session.id)

    def _part(self, key: PartKey, part: list[object], new: dict[PartKey, tuple[list[object], bytes, str]]) -> str:
        """The digest of the part stored at ``key``: as written before if it holds equal items, else encoded now (into ``new``)."""
        known = self.parts.digest(key, part)
        if known is not None:
            return known
        raw = _encoder.encode(part)
        new[key] = (part, raw, _digest(raw))
        return new[key][2]

    def _get(self, key: tuple[str | int, ...]) -> bytes | None:
        """The value stored at ``key``, opened; None when there is none or it does not open (``Sealer``)."""
        raw = self.cache.get(key)
        return None if raw is None else self.sealer.open(raw, _context(key))

    def flush(self) -> None:
        """Wait for the writes submitted so far."""
        if self.pending is not None:
            self.pending.result()

    def close(self) -> None:
        self.writer.shutdown(wait=True)
        self.cache.close()

    def _remember(self, namespace: str, session: Session) -> None:
        """Keep ``session`` in memory, where the next request finds it before it reaches the disk."""
        key = (namespace, session.id)
        with self.lock:
            self.recent[key] = session
            self.recent.move_to_end(key)
            while len(self.recent) > self.recent_size:
                self.transcripts.pop(self.recent.popitem(last=False)[0], None)

    def _recognise(self, namespace: str, session: Session, said: bytes) -> None:
        """Let a follow-up find ``session`` by the transcript ``said`` of the messages its chain links."""
        key = (namespace, session.id)
        with self.lock:
            if key in self.recent and session.chain:
                self.transcripts[key] = (session.chain[-1], said)


class _KnownParts:
    """What this process last wrote or read at each part's key (the most recent ``size``).

    A follow-up's pages are mostly the very objects of the request before it,
    and its chain the same links: a part of equal items decodes to the same
    items, so it is neither encoded nor written again. Comparing starts with
    identity, so the same objects cost no more than a pointer each.
    """

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[PartKey, tuple[str, list[object]]] = OrderedDict()
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
        with self._lock:
            self._entries[key] = (digest, part)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def forget(self, key: PartKey) -> None:
        with self._lock:
            self._entries.pop(key, None)


def _lists(session: Session, pages: PagedHistory) -> dict[str, list[object]]:
    """The lists of ``session`` (with ``pages``) that are stored in parts, by name."""
    return {**{name: getattr(session, name) for name in SESSION_PARTED}, **{name: getattr(pages, name) for name in PAGES_PARTED}}


def _with_lists(session: Session, pages: PagedHistory, lists: dict[str, list[object]]) -> Session:
    """``session`` with ``pages``, and the parted lists named in ``lists`` in place of its own."""
    own = {name: items for name, items in lists.items() if name in SESSION_PARTED}
    paged = {name: items for name, items in lists.items() if name in PAGES_PARTED}
    return msgspec.structs.replace(session, **own, pages=msgspec.structs.replace(pages, **paged))


def _context(key: tuple[str | int, ...]) -> str:
    """What a sealed value is bound to: its key, so it opens nowhere else."""
    return _SEPARATOR.join(map(str, key))


def _digest(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def _stored(start: int, end: int) -> list[int]:
    """The positions in ``start..end`` whose links a session of ``end`` messages writes."""
    return [i for i in range(start, end) if i < LINK_STRIDE or (i + 1) % LINK_STRIDE == 0 or i == end - 1]


def _probes(n: int) -> list[int]:
    """The positions of an ``n``-link chain a lookup tries, latest first."""
    below = max(n - LINK_STRIDE, 0)  # the tail starts here
    strided = range(below // LINK_STRIDE * LINK_STRIDE - 1, LINK_STRIDE - 1, -LINK_STRIDE)
    return [*range(n - 1, below - 1, -1), *strided, *range(min(below, LINK_STRIDE) - 1, -1, -1)]
