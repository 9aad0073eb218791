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

from pcp_core import Session, common_prefix, parted_id, reconciled, transcript

from .base import ANY, Commit, Store, new_version
from .embedded import EmbeddedStore
from .recent_sessions import Held as _Held
from .recent_sessions import RecentSessions
from .sealing import Sealer
from .session_lookup import LINK_STRIDE, Kept, SessionLookup
from .session_parts import TRANSCRIPTS, KnownParts, Layout, Parts, transcript_digest

__all__ = ["Kept", "Saved", "SessionStore"]

log = logging.getLogger("pcp.sessions")

RECENT = 64  # sessions kept decoded in memory
# The parts this process wrote or read last, with their items: a part that holds
# equal items is not encoded again. Bounded: it keeps those items alive.
KNOWN_PARTS = 4096
CONFLICTS = 8  # a write that keeps losing to other writers gives up after this many tries (logged)


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


class SessionStore(SessionLookup):
    """Where sessions live: found by ``SessionLookup``, written here in the background, in order."""

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
    ) -> Saved:
        """Keep ``session`` (its last ``new_links`` links are new) if the store still holds version ``base``; written in the
        background. What the store will have kept comes later (``Saved.kept``), the id it keeps it under at once.

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
        """One save, on the writer's thread: amended on the first save of the request, or committed on its base."""
        text = transcript(linked) if linked is not None else None
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
            return self._conditional(namespace, session, new_links, base, version, text, pinned, mine)
        except Exception:
            self._settled(namespace, mine, None)  # memory must not hold what the store does not
            if self.shared:
                raise  # the request waits for it: its answer is not complete without it
            log.exception("session %s was not saved", session.id)  # a full disk costs the session's survival of a restart
            return None

    def _conditional(
        self, namespace: str, session: Session, new_links: int, base: str | None, version: str, text: bytes | None, pinned: bool, mine: tuple[str, str]
    ) -> Kept | None:
        """Commit ``session`` on ``base``; when another write came first, what ``reconciled`` keeps instead, on the winner's version."""
        for _ in range(CONFLICTS):
            if self._commit(namespace, session, new_links, base, version, text):
                kept = Kept(session, version)
                self._settled(namespace, mine, kept)
                if text is not None:
                    self._recognise(namespace, session, text)
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
        """Count a conflict by how it was resolved."""
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

    def _commit(self, namespace: str, session: Session, new_links: int, base: str | None, version: str, text: bytes | None) -> bool:
        """Write a session's record, parts and links, if the store holds version ``base``: whether it did."""
        writes, trims, kept, new = self.layout.writes(namespace, session)
        n = len(session.chain)
        for i in _stored(n - new_links, n):
            writes[("link", namespace, session.chain[i])] = session.id.encode()
        if text is not None and session.chain:
            writes[(TRANSCRIPTS, namespace, transcript_digest(text))] = f"{session.id} {session.chain[-1]}".encode()
        if session.asked:
            writes[("asked", namespace, session.asked[0])] = session.id.encode()
        if not self.store.commit(Commit(("version", namespace, session.id), ANY if base is None else base, version, writes, trims, kept)):
            return False
        for first in trims:
            self.layout.known.trimmed(first)
        for key, (part, digest) in new.items():  # in the store now
            self.layout.known.add(key, part, digest)
        return True

    def close(self) -> None:
        """Finish the writes and close the store."""
        self.writer.shutdown(wait=True)
        self.store.close()

    @property
    def resident_bytes(self) -> int:
        """What the sessions kept in memory hold, estimated."""
        return self.recent.resident_bytes

    def _recognise(self, namespace: str, session: Session, text: bytes) -> None:
        """Let a follow-up find ``session`` by the transcript ``text`` of the messages its chain links."""
        if session.chain:
            self.recent.recognise((namespace, session.id), session.chain[-1], text)


def _stored(start: int, end: int) -> list[int]:
    """The positions in ``start..end`` whose links a session of ``end`` messages writes."""
    return [i for i in range(start, end) if i < LINK_STRIDE or (i + 1) % LINK_STRIDE == 0 or i == end - 1]
