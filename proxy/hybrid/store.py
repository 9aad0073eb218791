"""Hybrid mode's state on sessions: each session's snapshot, round, todo list and cold payloads.

One ``HybridState`` per (namespace, session id) in ``PCP_DATA_DIR/context``
(a ``KeyedStore``: sealed with ``PCP_DATA_KEY``, the recent ones in memory).
Beside them, for conversations below the threshold that name no session, the
link each session was last seen at (``pcp_core.hybrid.continuity``): one
entry a session, replaced as it moves on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import msgspec

from pcp_core.hybrid import Cold, Snapshot, TodoItem

from ..storage.base import Store
from ..storage.keyed_store import KeyedStore, store_key, stored_as
from ..storage.sealing import Sealer

__all__ = ["HybridState", "HybridStore"]

RECENT_LINKS = 4096  # links kept in memory (each is also on disk)
# A link's key: "@" is in no session id, so a link never meets a session's state.
_LINK = "@"


class HybridState(msgspec.Struct, frozen=True, kw_only=True):
    snapshot: Snapshot | None = None  # None: no round yet (a todo list set before the first request)
    round: int = 0  # the round the snapshot was made in; the next request's is one more
    startup_at: int = 0  # the session's first round, epoch milliseconds
    todo: tuple[TodoItem, ...] = ()
    cold: Cold = Cold()  # the payloads of its placeholders, and the placeholders that no longer fit
    link: str = ""  # the conversation's link at its last round, when the session was recognised by it
    given: tuple[str, ...] = ()  # the ids of the core blocks its last round gave its memory scope, if it named one


class HybridStore(KeyedStore[HybridState]):
    def __init__(self, store: Store | Path, sealer: Sealer | None = None):
        """Sessions' Hybrid-mode state kept in ``store``, sealed with ``sealer``."""
        super().__init__(store, HybridState, "the context of a session", sealer)
        self.links: OrderedDict[str, str] = OrderedDict()  # link key -> session id, the recent ones

    def change(self, namespace: str, session_id: str, step: Callable[[HybridState | None], HybridState | None]) -> HybridState | None:
        """Keep ``step(state)`` as the session's state (None: leave it as it is), and return it."""
        with self.lock:
            state, changed = self._change(store_key(namespace, session_id), step)
            if changed is not None and changed is not state and changed.link != (state.link if state is not None else ""):
                self._relink(namespace, session_id, state.link if state is not None else "", changed.link)
        return changed

    def session_at(self, namespace: str, link: str) -> str | None:
        """The session last seen at ``link``, if any (may read the disk: call from a thread)."""
        key = store_key(namespace, _LINK + link)
        with self.lock:
            if key in self.links:
                return self.links[key]
            if not self.shared and key not in self.known:
                return None
        stored = self.store.get(stored_as(key))
        return stored.decode() if isinstance(stored, bytes) else None

    def _relink(self, namespace: str, session_id: str, old: str, new: str) -> None:
        """The session is now known by ``new``; ``old`` (where it was) names it no more."""
        if old:
            key = store_key(namespace, _LINK + old)
            self.links.pop(key, None)
            self.known.discard(key)
            self._put_raw(key, None)
        if new:
            key = store_key(namespace, _LINK + new)
            self.links[key] = session_id
            self.links.move_to_end(key)
            if len(self.links) > RECENT_LINKS:
                self.links.popitem(last=False)
            if not self.shared:
                self.known.add(key)
            self._put_raw(key, session_id.encode())
