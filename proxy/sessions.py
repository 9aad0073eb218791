"""Where sessions live: diskcache in the data dir, with the recent ones kept in memory.

Keys are namespaced by the caller (a hash of its key), so one caller can neither
find nor pin another's session. Two kinds of entries:

* ``("session", namespace, id)`` → the session (msgpack): its chain, first-seen
  times and pages;
* ``("link", namespace, link)`` → the id of the session that link belongs to.

A link can outlive its session's knowledge of it (the session was rebuilt after
an edit, or evicted); every lookup checks the link against the session's chain.
Writes go through one background thread, in order, so a follow-up never waits
on the disk; a lookup that must read links first waits for the writes queued
before it, and ``close()`` finishes them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import diskcache
import msgspec

from pcp_core.pages import short_hash
from pcp_core.session import Session, common_prefix

__all__ = ["SessionStore"]

log = logging.getLogger("pcp.sessions")

RECENT = 64  # sessions kept decoded in memory
# Links go to disk for the first LINK_STRIDE messages, every LINK_STRIDE-th
# after them and a session's last one: a 200k-token history's first write is
# some 300 entries, not 5,000. A lookup probes the last LINK_STRIDE positions
# (where a follow-up's known end lies) and every stored position before them;
# the session's full chain then gives the exact common prefix.
LINK_STRIDE = 16
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Session)


class SessionStore:
    def __init__(self, directory: Path, recent: int = RECENT):
        directory.mkdir(parents=True, exist_ok=True)
        self.cache = diskcache.Cache(str(directory), cull_limit=0)
        self.recent: OrderedDict[tuple[str, str], Session] = OrderedDict()
        self.lock = threading.Lock()  # requests read ``recent`` from worker threads
        self.recent_size = recent
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcp-sessions")
        self.pending: Future[None] | None = None

    # -- reading (blocking: call from a thread) -----------------------------------------
    def load(self, namespace: str, session_id: str) -> Session | None:
        with self.lock:
            session = self.recent.get((namespace, session_id))
        if session is not None:
            return session
        raw = self.cache.get(("session", namespace, session_id))
        if raw is None:
            return None
        try:
            session = _decoder.decode(raw)
        except msgspec.DecodeError:  # written by an incompatible version: page afresh
            return None
        self.remember(namespace, session)
        return session

    def resolve(self, namespace: str, chain: list[str], pinned: str | None = None) -> tuple[Session | None, int]:
        """The session a request continues (the pinned one, or the longest known prefix's), and how many of its messages it holds."""
        if pinned is not None:
            found = self.load(namespace, pinned)
            return found, common_prefix(found.chain, chain) if found else 0
        return self.find(namespace, chain)

    def find(self, namespace: str, chain: list[str]) -> tuple[Session | None, int]:
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
            session = self.load(namespace, session_id)
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

    @staticmethod
    def fresh_id(namespace: str, chain: list[str]) -> str:
        return "s-" + short_hash(namespace, *chain[:1], str(time.time_ns()), length=16)

    # -- writing --------------------------------------------------------------------------
    def save(self, namespace: str, session: Session, new_links: int) -> None:
        """Keep ``session`` (its last ``new_links`` links are new); the disk write happens in the background."""
        self.remember(namespace, session)
        self.pending = self.writer.submit(self._write, namespace, session, new_links)

    def _write(self, namespace: str, session: Session, new_links: int) -> None:
        try:
            n = len(session.chain)
            with self.cache.transact():
                self.cache.set(("session", namespace, session.id), _encoder.encode(session))
                for i in _stored(n - new_links, n):
                    self.cache.set(("link", namespace, session.chain[i]), session.id)
            self.cache.cull()  # once per write, not once per entry (``cull_limit=0``)
        except Exception:  # a full disk costs the session's survival of a restart, not the request
            log.exception("session %s was not saved", session.id)

    def flush(self) -> None:
        """Wait for the writes submitted so far."""
        if self.pending is not None:
            self.pending.result()

    def close(self) -> None:
        self.writer.shutdown(wait=True)
        self.cache.close()

    def remember(self, namespace: str, session: Session) -> None:
        """Keep ``session`` in memory, where the next request finds it before it reaches the disk."""
        with self.lock:
            self.recent[(namespace, session.id)] = session
            self.recent.move_to_end((namespace, session.id))
            while len(self.recent) > self.recent_size:
                self.recent.popitem(last=False)


def _stored(start: int, end: int) -> list[int]:
    """The positions in ``start..end`` whose links a session of ``end`` messages writes."""
    return [i for i in range(start, end) if i < LINK_STRIDE or (i + 1) % LINK_STRIDE == 0 or i == end - 1]


def _probes(n: int) -> list[int]:
    """The positions of an ``n``-link chain a lookup tries, latest first."""
    below = max(n - LINK_STRIDE, 0)  # the tail starts here
    strided = range(below // LINK_STRIDE * LINK_STRIDE - 1, LINK_STRIDE - 1, -LINK_STRIDE)
    return [*range(n - 1, below - 1, -1), *strided, *range(min(below, LINK_STRIDE) - 1, -1, -1)]
