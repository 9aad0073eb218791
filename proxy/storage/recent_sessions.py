"""The sessions a process keeps decoded in memory: least recently used first out, bounded by count and by bytes.

The store is the truth: a session dropped here is read from it again when a
request continues it. What a session holds is estimated (``proxy.resident``)
with the transcript a follow-up finds it by; the one kept last always stays,
whatever its size.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from pcp_core import Session

from ..resident import session_bytes

__all__ = ["Held", "Key", "RecentSessions"]

Key = tuple[str, str]  # (namespace, session id)


class Held(NamedTuple):
    """A recent session in memory, valid while the store holds ``version``.

    ``pending``: its write is queued; this process trusts it, as the write is
    conditional and fixes memory if it loses.
    """

    session: Session
    version: str
    pending: bool = False


class RecentSessions:
    """Safe to share between threads: requests read it from theirs, the store's writer from its own."""

    def __init__(self, count: int, max_bytes: int = 0):
        self.count = count
        self.max_bytes = max_bytes  # 0: bounded by count alone
        self.held: OrderedDict[Key, Held] = OrderedDict()
        # The transcript of a recent session's messages, with the last link of the
        # chain it was taken for: how a follow-up finds it without a chain of its own.
        # A session kept since under another chain (a concurrent request's) does not match it.
        self.transcripts: dict[Key, tuple[str, bytes]] = {}
        self.sizes: dict[Key, int] = {}
        self.resident_bytes = 0
        self.lock = threading.Lock()
        self.on_left: Callable[[], None] = lambda: None  # a session left memory (``proxy.resident.TextMemos``)

    def get(self, key: Key) -> Held | None:
        """The session held under ``key``, if any."""
        with self.lock:
            return self.held.get(key)

    def of(self, namespace: str) -> dict[str, Held]:
        """The recent sessions of ``namespace``, by id."""
        with self.lock:
            return {key[1]: held for key, held in self.held.items() if key[0] == namespace}

    def transcribed(self, namespace: str) -> list[tuple[Held, bytes]]:
        """The recent sessions of ``namespace`` that a transcript finds, with it."""
        with self.lock:
            return [
                (self.held[key], known)
                for key, (last, known) in self.transcripts.items()
                if key[0] == namespace and self.held[key].session.chain[-1:] == [last]
            ]

    def put(self, key: Key, held: Held) -> None:
        """Hold ``held`` under ``key``, the least recently used dropped past the bounds."""
        with self.lock:
            was, known = self.held.get(key), self.sizes.get(key, 0) - self._transcript_bytes(key)
        size = self._size(held.session, was.session if was is not None else None, known)
        with self.lock:
            self.held[key] = held
            self.held.move_to_end(key)
            self._resize(key, size + self._transcript_bytes(key))
            self._trim()

    def recognise(self, key: Key, last: str, text: bytes) -> None:
        """Let a follow-up find the session by the transcript ``text`` of its messages (``last``: its chain's last link)."""
        with self.lock:
            if key in self.held:
                self._resize(key, self.sizes.get(key, 0) + len(text) - self._transcript_bytes(key))
                self.transcripts[key] = (last, text)
                self._trim()  # the transcript counts too: the bound holds once it is in

    def replace(self, key: Key, version: str, kept: Held | None) -> None:
        """A write is done: unless a later one replaced the session held at ``version``, ``kept`` stands in its place."""
        with self.lock:
            held = self.held.get(key)
            if held is None or held.version != version:
                return
            if kept is None or kept.session.id != key[1]:
                self._drop(key)
        if kept is not None:
            self.put((key[0], kept.session.id), kept)

    def drop(self, key: Key) -> None:
        """Forget the session under ``key``."""
        with self.lock:
            self._drop(key)

    def clear(self) -> None:
        """Forget every session."""
        with self.lock:
            for key in list(self.held):
                self._drop(key)

    @staticmethod
    def _size(session: Session, was: Session | None, known: int) -> int:
        """What ``session`` holds: counted when first kept (outside the lock); for the
        same session gone on (a follow-up), scaled from what it held by its messages, in O(1) on the event loop."""
        if was is None or not was.chain or not session.chain or was.chain[0] != session.chain[0]:
            return session_bytes(session)
        return known if was is session else known * len(session.chain) // len(was.chain)

    def _transcript_bytes(self, key: Key) -> int:
        """The bytes of the transcript kept for ``key``."""
        known = self.transcripts.get(key)
        return len(known[1]) if known is not None else 0

    def _resize(self, key: Key, size: int) -> None:
        """Count ``key`` at ``size`` bytes."""
        self.resident_bytes += size - self.sizes.get(key, 0)
        self.sizes[key] = size

    def _trim(self) -> None:
        """Drop the least recently used sessions past the bounds (the last one stays, whatever its size). Lock held."""
        left = False
        while len(self.held) > self.count or (self.max_bytes and self.resident_bytes > self.max_bytes and len(self.held) > 1):
            self._drop(next(iter(self.held)))
            left = True
        if left:
            self.on_left()

    def _drop(self, key: Key) -> None:
        """Forget ``key`` (the lock held)."""
        self.held.pop(key, None)
        self.transcripts.pop(key, None)
        self.resident_bytes -= self.sizes.pop(key, 0)
