"""Where sessions live: a ``Store`` (diskcache in the data dir, or Redis), with the recent ones kept in memory.

Keys are namespaced by the caller (a hash of its key), so one caller can
neither find nor pin another's session; how a session is laid out in keys is
``session_parts``. A link can outlive its session's knowledge of it (the
session was rebuilt after an edit, or evicted); every lookup checks the link
against the session's chain. A session one of whose parts is gone (culled)
or does not match is not found: it is paged again.

Every write is conditional on the version it read (``Resolution.version``):
of two requests that continued one session at the same time, the second to
write loses, and keeps what ``pcp_core.reconciled`` says instead — the
winner with its own solidified pages, its own session if it holds the
winner's messages, or a fork of its own — so neither's messages are lost
nor paged again. With a shared store (``Store.shared``: Redis, or workers
sharing the data dir) a session kept in memory is used only while the
store still holds the version it was kept at.

Memory is bounded by count (``recent``) and by bytes (``max_bytes``, the
``cache_mb`` setting's share, ``proxy.resident``): past either, the least
recently used session is dropped, and read again from the store when a
request continues it.

Writes go through one background thread, in order, so a request never waits
on the store to compute; ``save`` gives a future of what was kept (a
request on a shared store waits for it before its answer is complete), a
lookup that must read links first waits for the writes queued before it, and
``close()`` finishes them.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from pcp_core import (
    Conversation,
    Resolution,
    Session,
    begins_with,
    branch_id,
    branch_probes,
    chain_links,
    common_prefix,
    departs,
    identity,
    links_continuing,
    longest_extended,
    parted_id,
    question_links,
    reconciled,
    transcript,
)

from .base import ANY, Commit, Store, new_version
from .embedded import EmbeddedStore
from .recent_sessions import Held as _Held
from .recent_sessions import RecentSessions
from .sealing import Sealer
from .session_parts import KnownParts, Layout, Parts, prefix_digests, said_digest

__all__ = ["Kept", "Saved", "SessionStore"]

log = logging.getLogger("pcp.sessions")

RECENT = 64  # sessions kept decoded in memory
# Links go to the store for the first LINK_STRIDE messages, every LINK_STRIDE-th
# after them and a session's last one: a 200k-token history's first write is
# some 300 entries, not 5,000. A lookup probes the last LINK_STRIDE positions
# (where a follow-up's known end lies) and every stored position before them;
# the session's full chain then gives the exact common prefix.
LINK_STRIDE = 16
# The parts this process wrote or read last, with their items: a part that holds
# equal items is not encoded again. Bounded: it keeps those items alive.
KNOWN_PARTS = 4096
READS = 3  # a session read while another process writes it is read again, this many times at most
CONFLICTS = 8  # a write that keeps losing to other writers gives up after this many tries (logged)
BRANCH_HOPS = 4  # a request that leaves the session it was found by looks this many branches further, at most


class Kept(NamedTuple):
    """A session as the store holds it, and the version it holds it at."""

    session: Session
    version: str


class Saved(NamedTuple):
    """A session sent to the store: what the store will have kept, and the id it is kept under.

    ``id`` is known at once (an answer names it): the request's own session's,
    or, when a concurrent request of this process kept that id first and the
    two went apart, the id of the branch this one goes on in (``parted_id``).
    With a shared store, another process may yet come first: ``kept`` says.
    """

    kept: Future[Kept | None]
    id: str
    known: bool = True  # False: this process cannot tell (the session it read is no longer in memory): ``kept`` says


class SessionStore:
    def __init__(
        self, store: Store | Path, recent: int = RECENT, sealer: Sealer | None = None, metrics: Any = None, max_bytes: int = 0, parts: Parts = Parts()
    ):
        self.store: Store = EmbeddedStore(store, cull=True) if isinstance(store, Path) else store
        self.shared = self.store.shared
        self.layout = Layout(sealer or Sealer(), KnownParts(KNOWN_PARTS), parts)  # records and parts hold the conversation's text
        self.recent: RecentSessions = RecentSessions(recent, max_bytes)
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcp-sessions")
        self.pending: Future[Kept | None] | None = None
        self.saving = threading.Lock()  # what ``save`` foresees of the writes before it, and the write it queues, at once
        self.metrics = metrics  # counts the conflicts (``pcp_session_conflicts_total``)

    # -- reading (blocking: call from a thread) -----------------------------------------
    def resolve(self, namespace: str, conversation: Conversation, pinned: str | None = None) -> Resolution:
        """The session the request's chained messages continue: the pinned one, or the longest known prefix's
        (when the request leaves that one, the branch it goes on in, if one of its requests was kept before).

        A follow-up is found in memory by its history's transcript, or in the
        store by the digests of its history's last prefixes, and only its new
        messages are linked; otherwise the whole chain is linked and looked up,
        in memory and then in the store.
        """
        found = self._found(namespace, conversation, pinned)
        resolution = msgspec.structs.replace(found, asked=question_links(conversation, found.links))
        return resolution if pinned is not None else self._branched(namespace, conversation, resolution)

    def _found(self, namespace: str, conversation: Conversation, pinned: str | None) -> Resolution:
        chained = conversation.chained
        if pinned is None and conversation.history:
            said = transcript(conversation.history)
            held = self._continued(namespace, said)
            if held is not None:
                links, reused = links_continuing(held.session, chained, len(conversation.history), len(held.session.chain))
                return Resolution(found=held.session, reused=reused, links=links, version=held.version)
            found = self._by_transcript(namespace, conversation, said)
            if found is not None:
                return found
        links = chain_links(chained)
        history = links[: len(conversation.history)]
        if pinned is not None:
            kept = self._load(namespace, pinned)
            if kept is None:
                return Resolution(links=links, pinned=pinned)
            return Resolution(found=kept.session, reused=common_prefix(kept.session.chain, history), links=links, pinned=pinned, version=kept.version)
        kept, reused = self._find(namespace, history)
        return Resolution(found=kept.session if kept else None, reused=reused, links=links, version=kept.version if kept else "")

    def _branched(self, namespace: str, conversation: Conversation, resolution: Resolution) -> Resolution:
        """The branch the request goes on in, when it leaves the session it was found by.

        Branches of one history hold the same messages (they differ in the
        question each answered, ``Session.asked``): which of them a lookup
        finds first says nothing. A branch is found by the question it
        answered (at ``at``, or just before it: a question asked again at an
        earlier point), or by the id it took leaving the session found (``branch_id``).
        """
        said, history = resolution.request_links, resolution.links[: len(conversation.history)]
        for _ in range(BRANCH_HOPS):
            found = resolution.found
            at = departs(found, said) if found is not None else None
            if found is None or at is None:
                return resolution
            better = None
            for i in branch_probes(said, at):
                for session_id in dict.fromkeys([branch_id(namespace, found.id, said, i), *self._asking(namespace, said[i])]):
                    kept = self._load(namespace, session_id) if session_id != found.id else None
                    if kept is None:
                        continue
                    held = identity(kept.session)
                    shared = common_prefix(held, said)
                    if shared > at or shared == at == len(held):  # it leaves this one later, or goes on from it
                        better = kept
                        break
                if better is not None:
                    break
            if better is None:
                if len(found.chain) <= at < len(history):
                    # It went on from the question ``found`` answered, sent again otherwise (a client that
                    # rewrites its own message), and no branch asked it so: the same conversation, going on.
                    return msgspec.structs.replace(resolution, found=msgspec.structs.replace(found, asked=[]))
                return resolution
            reused = common_prefix(better.session.chain, history)
            resolution = Resolution(found=better.session, reused=reused, links=resolution.links, version=better.version, asked=resolution.asked)
        return resolution

    def _asking(self, namespace: str, link: str) -> list[str]:
        """The sessions whose last question opens with ``link`` (``Session.asked``): those in memory, else the one the store knows."""
        held = [session_id for session_id, held in self.recent.of(namespace).items() if held.session.asked[:1] == [link]]
        if held:
            return held
        stored = self.store.get(("asked", namespace, link))
        return [stored.decode()] if stored is not None else []

    def stored(self) -> list[tuple[str, str]]:
        """(namespace, id) of every session in the store."""
        return [(str(key[1]), str(key[2])) for key in self.store.keys("session")]

    def holds(self, namespace: str, session_id: str) -> bool:
        """Whether the session is kept (in memory, its write maybe on its way, or in the store), without reading it."""
        return self.recent.get((namespace, session_id)) is not None or self.store.contains(("session", namespace, session_id))

    def read(self, namespace: str, session_id: str) -> Session | None:
        """The session, for a look inside (the inspector, the CLI): read without joining the recent ones."""
        kept = self._load(namespace, session_id, remember=False)
        return kept.session if kept is not None else None

    def _load(self, namespace: str, session_id: str, remember: bool = True) -> Kept | None:
        held = self.recent.get((namespace, session_id))
        if held is not None and self._valid(namespace, held):
            return Kept(held.session, held.version)
        kept = self._read(namespace, session_id)
        if kept is not None and remember:
            self._remember(namespace, _Held(*kept))
        return kept

    def _read(self, namespace: str, session_id: str) -> Kept | None:
        """The session as the store holds it now, with its version; None if it is not there whole.

        Its version and record are read together; a part that does not match
        the record was written since by another process: read again.
        """
        version_key, record_key = ("version", namespace, session_id), ("session", namespace, session_id)
        for _ in range(READS):
            version, raw = self.store.get_many([version_key, record_key])
            record = self.layout.record(record_key, raw)
            keys = self.layout.part_keys(namespace, record) if record is not None else None
            if record is None or keys is None:
                return None
            session = self.layout.assemble(record, keys, self.store.get_many(keys))
            if session is not None:
                return Kept(session, version.decode() if version else "")
            if self.store.get(version_key) == version:  # no write since: a part is gone for good
                return None
        return None

    def _valid(self, namespace: str, held: _Held) -> bool:
        """Whether a session kept in memory is still the store's: always, unless another process may write it."""
        if not self.shared or held.pending:
            return True
        stored = self.store.get(("version", namespace, held.session.id))
        return (stored.decode() if stored else "") == held.version

    def _find(self, namespace: str, chain: list[str]) -> tuple[Kept | None, int]:
        """The session holding the longest prefix of ``chain``, and that prefix's length."""
        extended = self._extended(namespace, chain)
        if extended is not None:
            return Kept(extended.session, extended.version), len(extended.session.chain)
        # Links reach the store in the background: a fork that comes right after
        # its parent must still find the parent's links.
        self.flush()
        for i in _probes(len(chain)):
            session_id = self.store.get(("link", namespace, chain[i]))
            if session_id is None:
                continue
            kept = self._load(namespace, session_id.decode())
            if kept is not None and i < len(kept.session.chain) and kept.session.chain[i] == chain[i]:
                return kept, common_prefix(kept.session.chain, chain)
        return None, 0

    def _by_transcript(self, namespace: str, conversation: Conversation, said: bytes) -> Resolution | None:
        """The session a follow-up continues, found in the store by the transcript digests of its history's last prefixes."""
        history = conversation.history
        probes = prefix_digests(said, history, LINK_STRIDE)
        for (n, _), value in zip(probes, self.store.get_many([("said", namespace, d) for _, d in probes])):
            if value is None:
                continue
            session_id, _, last = value.decode().partition(" ")
            kept = self._load(namespace, session_id)
            if kept is None or len(kept.session.chain) < n or kept.session.chain[n - 1] != last:
                continue
            links, reused = links_continuing(kept.session, conversation.chained, len(history), n)
            return Resolution(found=kept.session, reused=reused, links=links, version=kept.version)
        return None

    def _extended(self, namespace: str, chain: list[str]) -> _Held | None:
        """The longest recent session that ``chain`` extends: a follow-up, found without the store."""
        recent = self.recent.of(namespace)
        session = longest_extended(chain, (held.session for held in recent.values()))
        best = recent[session.id] if session is not None else None
        return best if best is not None and self._valid(namespace, best) else None

    def _continued(self, namespace: str, said: bytes) -> _Held | None:
        """The longest recent session whose messages the transcript ``said`` opens with: a follow-up, found without its chain."""
        best = None
        for held, known in self.recent.transcribed(namespace):
            if (best is None or len(held.session.chain) > len(best.session.chain)) and begins_with(said, known):
                best = held
        if best is not None and not self._valid(namespace, best):
            self._settled(namespace, (best.session.id, best.version), None)  # another process has written it since
            return None
        return best

    # -- writing --------------------------------------------------------------------------
    def save(
        self,
        namespace: str,
        session: Session,
        new_links: int,
        linked: list[dict] | None = None,
        *,
        base: str | None = None,
        pinned: bool = False,
        after: Future[Kept | None] | None = None,
    ) -> Future[Kept | None]:
        """``keep``, for a caller that needs no id before the store has kept the session: what it will have kept."""
        return self.keep(namespace, session, new_links, linked, base=base, pinned=pinned, after=after).kept

    def keep(
        self,
        namespace: str,
        session: Session,
        new_links: int,
        linked: list[dict] | None = None,
        *,
        base: str | None = None,
        pinned: bool = False,
        after: Future[Kept | None] | None = None,
    ) -> Saved:
        """Keep ``session`` (its last ``new_links`` links are new) if the store still holds version ``base``; written in the background.

        ``base`` is the version the request read (``Resolution.version``; "" for
        a session not stored yet); None writes whatever the store holds.

        ``linked``: the messages its chain links, by whose transcript a follow-up
        finds it. ``pinned``: the client named the session (it follows the
        client). ``after``: the save of the same request this one amends (the
        pages its answer solidified): kept on top of whatever that one kept.
        The future gives what the store kept; it raises if the store failed.

        A store no other process writes holds what this process's saves leave,
        in order: when another request kept the session since ``base``, what
        the writer would keep instead (``reconciled``) is known now, and the id
        with it. With a shared store the writer finds out (``Saved.kept``).
        """
        with self.saving:
            if after is not None:
                held = self.recent.get((namespace, session.id))
                # What this process's next request finds at once: the session as the first save left it, with these pages.
                merged = reconciled(session, held.session, session.id) if held is not None else session
            else:
                foreseen = self._foreseen(namespace, session, new_links, base, pinned)
                if isinstance(foreseen, Kept):  # the session already holds all this request brought
                    done: Future[Kept | None] = Future()
                    done.set_result(foreseen)
                    return Saved(done, foreseen.session.id)
                merged, new_links, base, known = foreseen
                session = merged
            version = new_version()
            if merged is not None:
                self._remember(namespace, _Held(merged, version, pending=True))  # this process's next request finds it at once
            self.pending = self.writer.submit(self._write, namespace, session, new_links, linked, base, version, pinned, after)
            return Saved(self.pending, session.id, after is not None or not self.shared and known)

    def _foreseen(self, namespace: str, session: Session, new_links: int, base: str | None, pinned: bool) -> Kept | tuple[Session, int, str | None, bool]:
        """What a save on ``base`` keeps, as far as this process knows: the session (its new links, its base, and
        whether that is known), or the session kept already that holds all of it. Only a store no other process
        writes is known so well, and only while the session's last write here is in memory (a session not
        stored yet is taken to be new)."""
        for _ in range(CONFLICTS):
            held = None if self.shared or base is None else self.recent.get((namespace, session.id))
            if held is None or held.version == base:
                return session, new_links, base, held is not None or base == ""
            rebased = reconciled(session, held.session, parted_id(namespace, session, held.session), pinned=pinned)
            self._conflict(rebased, session, held.session)
            if rebased is None:
                return Kept(held.session, held.version)
            same = rebased.id == session.id
            new_links = len(rebased.chain) - (common_prefix(rebased.chain, held.session.chain) if same else 0)
            session, base = rebased, held.version if same else ""
        return session, new_links, base, False

    def _write(
        self,
        namespace: str,
        session: Session,
        new_links: int,
        linked: list[dict] | None,
        base: str | None,
        version: str,
        pinned: bool,
        after: Future[Kept | None] | None,
    ) -> Kept | None:
        said = transcript(linked) if linked is not None else None
        mine = (session.id, version)  # the entry ``save`` put in memory, replaced only while it is still there
        try:
            if after is not None:  # the same request's first save, done by now (one writer, in order)
                failed = after.exception()
                if failed is not None:  # what this one amends was not kept: neither is this (it once resolved to None, and the request answered 200)
                    raise failed
                first = after.result()
                amended = reconciled(session, first.session, first.session.id) if first is not None else None
                if first is None or amended is None:
                    self._settled(namespace, mine, first)
                    return first
                session, base = amended, first.version
            return self._conditional(namespace, session, new_links, base, version, said, pinned, mine)
        except Exception:
            self._settled(namespace, mine, None)  # memory must not hold what the store does not
            if self.shared:
                raise  # the request waits for it: its answer is not complete without it
            log.exception("session %s was not saved", session.id)  # a full disk costs the session's survival of a restart
            return None

    def _conditional(
        self, namespace: str, session: Session, new_links: int, base: str | None, version: str, said: bytes | None, pinned: bool, mine: tuple[str, str]
    ) -> Kept | None:
        """Commit ``session`` on ``base``; when another write came first, what ``reconciled`` keeps instead, on the winner's version."""
        for _ in range(CONFLICTS):
            if self._commit(namespace, session, new_links, base, version, said):
                kept = Kept(session, version)
                self._settled(namespace, mine, kept)
                if said is not None:
                    self._recognise(namespace, session, said)
                return kept
            stored = self.store.get(("version", namespace, session.id))
            winner = self._read(namespace, session.id)
            if winner is None:  # the version names nothing readable (evicted): the session is ours to write
                base = stored.decode() if stored else ""
                continue
            rebased = reconciled(session, winner.session, parted_id(namespace, session, winner.session), pinned=pinned)
            self._conflict(rebased, session, winner.session)
            if rebased is None:  # the winner holds all this request brought
                self._settled(namespace, mine, winner)
                return winner
            same = rebased.id == session.id
            new_links = len(rebased.chain) - (common_prefix(rebased.chain, winner.session.chain) if same else 0)
            session, base, version = rebased, winner.version if same else "", new_version()
        log.error("session %s was not saved: it kept changing under %d tries", session.id, CONFLICTS)
        self._settled(namespace, mine, None)
        return None

    def _conflict(self, kept: Session | None, mine: Session, winner: Session) -> None:
        if self.metrics is not None:
            how = (
                "winner"
                if kept is None
                else "forked"
                if kept.id != mine.id
                else "extended"
                if len(kept.chain) >= len(winner.chain) and kept.chain[: len(winner.chain)] == winner.chain
                else "replaced"
            )
            self.metrics.inc("pcp_session_conflicts_total", kept=how)

    def _commit(self, namespace: str, session: Session, new_links: int, base: str | None, version: str, said: bytes | None) -> bool:
        writes, trims, kept, new = self.layout.writes(namespace, session)
        n = len(session.chain)
        for i in _stored(n - new_links, n):
            writes[("link", namespace, session.chain[i])] = session.id.encode()
        if said is not None and session.chain:
            writes[("said", namespace, said_digest(said))] = f"{session.id} {session.chain[-1]}".encode()
        if session.asked:
            writes[("asked", namespace, session.asked[0])] = session.id.encode()
        if not self.store.commit(Commit(("version", namespace, session.id), ANY if base is None else base, version, writes, trims, kept)):
            return False
        for first in trims:
            self.layout.known.trimmed(first)
        for key, (part, digest) in new.items():  # in the store now
            self.layout.known.add(key, part, digest)
        return True

    def _settled(self, namespace: str, mine: tuple[str, str], kept: Kept | None) -> None:
        """A write is done: memory holds what the store kept in place of what ``save`` put there (unless a later save replaced that)."""
        self.recent.replace((namespace, mine[0]), mine[1], _Held(*kept) if kept is not None else None)

    def flush(self) -> None:
        """Wait for the writes submitted so far."""
        if self.pending is not None:
            try:
                self.pending.result()
            except Exception:
                pass  # the request that made it was told

    def close(self) -> None:
        self.writer.shutdown(wait=True)
        self.store.close()

    @property
    def resident_bytes(self) -> int:
        """What the sessions kept in memory hold, estimated."""
        return self.recent.resident_bytes

    def _remember(self, namespace: str, held: _Held) -> None:
        """Keep a session in memory, where the next request finds it before it reaches the store."""
        self.recent.put((namespace, held.session.id), held)

    def _recognise(self, namespace: str, session: Session, said: bytes) -> None:
        """Let a follow-up find ``session`` by the transcript ``said`` of the messages its chain links."""
        if session.chain:
            self.recent.recognise((namespace, session.id), session.chain[-1], said)


def _stored(start: int, end: int) -> list[int]:
    """The positions in ``start..end`` whose links a session of ``end`` messages writes."""
    return [i for i in range(start, end) if i < LINK_STRIDE or (i + 1) % LINK_STRIDE == 0 or i == end - 1]


def _probes(n: int) -> list[int]:
    """The positions of an ``n``-link chain a lookup tries, latest first."""
    below = max(n - LINK_STRIDE, 0)  # the tail starts here
    strided = range(below // LINK_STRIDE * LINK_STRIDE - 1, LINK_STRIDE - 1, -LINK_STRIDE)
    return [*range(n - 1, below - 1, -1), *strided, *range(min(below, LINK_STRIDE) - 1, -1, -1)]
