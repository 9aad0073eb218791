"""A store of one msgspec value per (namespace, name), for what the proxy keeps on sessions beside their pages.

PACT components (``proxy.pact.components``) and Hybrid mode's state
(``proxy.hybrid.store``) are kept so: in a ``Store`` (``PCP_DATA_DIR/<kind>``,
or Redis), under the caller's namespace, sealed with ``PCP_DATA_KEY`` when it
is set (they hold the client's text). With a store of its own process, writes
go through one background thread in order, so that a request never waits on
the disk; the recent values stay decoded in memory, and every key stored is
known from the start, so a request learns that a session has nothing from a
set, without reading the disk. With a shared store (workers, replicas) another
process may change a value at any time: values are read from the store, and a
change is written at once if the value's version is still the one it read; one
that loses steps again from the value now held (``_change``), so no change is lost.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Generic, TypeVar

import msgspec

from .base import Commit, Key, Store, StoreUnavailable, new_version
from .embedded import EmbeddedStore
from .sealing import Sealer

__all__ = ["KeyedStore", "store_key"]

log = logging.getLogger("pcp.store")

T = TypeVar("T")
RECENT = 256  # values kept decoded in memory
CHANGE_ATTEMPTS = 16  # conditional writes of one change against other processes' before it gives up
_SEPARATOR = "\x1f"
_encoder = msgspec.msgpack.Encoder()


def store_key(namespace: str, name: str) -> str:
    """The key of ``name`` in ``namespace``."""
    return f"{namespace}{_SEPARATOR}{name}"


def stored_as(key: str) -> tuple[str, ...]:
    """The store's key for ``key``: (namespace, name), kept on disk as the string it was."""
    return tuple(key.split(_SEPARATOR, 1))


class KeyedStore(Generic[T]):
    """Values of type ``kind`` by key (``store_key``): in memory, and in the store.

    A value is changed with ``_change`` (callers may hold ``lock`` around it and around ``_get``).
    """

    def __init__(self, store: Store | Path, kind: type[T], what: str, sealer: Sealer | None = None, recent: int = RECENT):
        self.store: Store = EmbeddedStore(store) if isinstance(store, Path) else store
        self.shared = self.store.shared
        self.sealer = sealer or Sealer()
        self.decoder = msgspec.msgpack.Decoder(kind)
        self.what = what  # for the log: "the components of a session"
        # The keys of every value stored, or about to be (its own process's store only).
        self.known: set[str] = set() if self.shared else {_SEPARATOR.join(map(str, key)) for key in self.store.keys("")}
        self.recent: OrderedDict[str, T] = OrderedDict()
        self.recent_size = 0 if self.shared else recent
        self.lock = threading.RLock()  # a change reads and writes a value as one step: a request and a route may meet
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcp-keyed")

    def holds(self, namespace: str, name: str) -> bool:
        """Whether the store holds a value for ``name``."""
        key = store_key(namespace, name)
        return self.store.contains(stored_as(key)) if self.shared else key in self.known

    def in_memory(self, namespace: str, name: str) -> bool:
        """Whether the value of ``name`` is in memory (no read needed)."""
        return store_key(namespace, name) in self.recent

    def get(self, namespace: str, name: str) -> T | None:
        """The value (may read the store: call from a thread unless ``in_memory``)."""
        with self.lock:
            return self._get(store_key(namespace, name))

    def close(self) -> None:
        """Finish the writes and close the store."""
        self.writer.shutdown(wait=True)
        self.store.close()

    def _get(self, key: str) -> T | None:
        """The value at ``key``: in memory, else read and opened from the store."""
        value = self.recent.get(key)
        if value is None and (self.shared or key in self.known):
            stored = self.store.get(stored_as(key))
            raw = self.sealer.open(stored, key) if stored is not None else None
            try:
                value = self.decoder.decode(raw) if raw is not None else None
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("%s could not be read back; it starts anew", self.what)
            if value is not None:
                self._remember(key, value)
        return value

    def _change(self, key: str, step: Callable[[T | None], T | None]) -> tuple[T | None, T | None]:
        """The value held and ``step`` of it, which is kept unless it is None or the value itself.

        Under ``lock``. With a shared store another process may change the value meanwhile:
        the write is conditional on the version read, and a change that loses reads the value
        again and steps from there, so that neither is lost.
        """
        with self.lock:
            if not self.shared:
                held = self._get(key)
                changed = step(held)
                if changed is not None and changed is not held:
                    self._put(key, changed)
                return held, changed
            version_key = ("version", *stored_as(key))
            for attempt in range(CHANGE_ATTEMPTS):
                if attempt:
                    time.sleep(random.uniform(0, 0.002 * attempt))  # losers of a race spread out
                version = self.store.get(version_key)
                held = self._get(key)
                changed = step(held)
                if changed is None or changed is held:
                    return held, changed
                writes: dict[Key, bytes] = {stored_as(key): self._sealed(key, changed)}
                if self.store.commit(Commit(version_key, version.decode() if version else "", new_version(), writes)):
                    return held, changed
        raise StoreUnavailable(f"{self.what} changed under each of {CHANGE_ATTEMPTS} attempts by other processes")

    def _put(self, key: str, value: T) -> None:
        """Keep ``value`` in a store of this process alone: in memory now, in the store by the writer thread."""
        self._remember(key, value)
        self.known.add(key)
        self.writer.submit(self._write, key, value)

    def _put_raw(self, key: str, raw: bytes | None) -> None:
        """A value that is not ``T`` (a link), or its removal (None): written as ``_put`` writes."""
        change = (lambda: self.store.set_many({stored_as(key): raw})) if raw is not None else (lambda: self.store.delete(stored_as(key)))
        if self.shared:
            change()
        else:
            self.writer.submit(change)

    def _remember(self, key: str, value: T) -> None:
        """Keep ``value`` in memory, the least recently used past the bound forgotten."""
        if not self.recent_size:
            return
        self.recent[key] = value
        self.recent.move_to_end(key)
        while len(self.recent) > self.recent_size:
            self.recent.popitem(last=False)

    def _sealed(self, key: str, value: T) -> bytes:
        """``value`` encoded and sealed for ``key``."""
        return self.sealer.seal(_encoder.encode(value), key)

    def _write(self, key: str, value: T) -> None:
        """Write ``value`` to the store (on the writer's thread); a failure is logged."""
        try:
            self.store.set_many({stored_as(key): self._sealed(key, value)})
        except Exception:  # a full disk costs the value's survival of a restart, not the request
            log.exception("%s was not saved", self.what)
