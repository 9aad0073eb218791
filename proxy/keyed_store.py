"""A store of one msgspec value per (namespace, name), for what the proxy keeps on sessions beside their pages.

PACT components (``proxy.components``) and Hybrid mode's state
(``proxy.hybrid_store``) are kept so: in ``PCP_DATA_DIR/<kind>`` (diskcache),
under the caller's namespace, sealed with ``PCP_DATA_KEY`` when it is set
(they hold the client's text), written by one background thread in order so
that a request never waits on the disk; the recent values stay decoded in
memory. Every key on disk is known from the start, so a request learns that
a session has nothing from a set, without reading the disk.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Generic, TypeVar

import diskcache
import msgspec

from .datadir import private_tree
from .sealing import Sealer

__all__ = ["KeyedStore", "store_key"]

log = logging.getLogger("pcp.store")

T = TypeVar("T")
RECENT = 256  # values kept decoded in memory
_SEPARATOR = "\x1f"
_encoder = msgspec.msgpack.Encoder()


def store_key(namespace: str, name: str) -> str:
    return f"{namespace}{_SEPARATOR}{name}"


class KeyedStore(Generic[T]):
    """Values of type ``kind`` by key (``store_key``): in memory, and on disk. Callers hold ``lock`` around ``_get``/``_put``."""

    def __init__(self, directory: Path, kind: type[T], what: str, sealer: Sealer | None = None, recent: int = RECENT):
        self.cache = diskcache.Cache(str(private_tree(directory)))
        self.sealer = sealer or Sealer()
        self.decoder = msgspec.msgpack.Decoder(kind)
        self.what = what  # for the log: "the components of a session"
        self.known: set[str] = set(self.cache.iterkeys())  # the keys of every value on disk, or about to be
        self.recent: OrderedDict[str, T] = OrderedDict()
        self.recent_size = recent
        self.lock = threading.Lock()  # a change reads and writes a value as one step: a request and a route may meet
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pcp-{directory.name}")

    def holds(self, namespace: str, name: str) -> bool:
        return store_key(namespace, name) in self.known

    def in_memory(self, namespace: str, name: str) -> bool:
        return store_key(namespace, name) in self.recent

    def get(self, namespace: str, name: str) -> T | None:
        """The value (may read the disk: call from a thread unless ``in_memory``)."""
        with self.lock:
            return self._get(store_key(namespace, name))

    def close(self) -> None:
        self.writer.shutdown(wait=True)
        self.cache.close()

    def _get(self, key: str) -> T | None:
        value = self.recent.get(key)
        if value is None and key in self.known:
            stored = self.cache.get(key)
            raw = self.sealer.open(stored, key) if isinstance(stored, bytes) else None
            try:
                value = self.decoder.decode(raw) if raw is not None else None
            except (msgspec.DecodeError, msgspec.ValidationError):
                log.warning("%s could not be read back; it starts anew", self.what)
            if value is not None:
                self._remember(key, value)
        return value

    def _put(self, key: str, value: T) -> None:
        self._remember(key, value)
        self.known.add(key)
        self.writer.submit(self._write, key, value)

    def _remember(self, key: str, value: T) -> None:
        self.recent[key] = value
        self.recent.move_to_end(key)
        while len(self.recent) > self.recent_size:
            self.recent.popitem(last=False)

    def _write(self, key: str, value: T) -> None:
        try:
            self.cache.set(key, self.sealer.seal(_encoder.encode(value), key))
        except Exception:  # a full disk costs the value's survival of a restart, not the request
            log.exception("%s was not saved", self.what)
