"""Where the proxy keeps what outlives a request: embedded (diskcache and SQLite in ``PCP_DATA_DIR``) or Redis (``PCP_STORE``).

``Stores`` is opened once per process by the app's lifespan. Every store the
proxy has — sessions, the summary cache, the vector cache, components,
Hybrid state, memory pages — gets its place from it, so one setting moves
them all. With ``PCP_STORE=redis://…`` they share one Redis client and its
pool; with workers (``PCP_WORKERS``) on the embedded store, they share the
data dir, and say so (``Store.shared``), so that what one process keeps in
memory is checked against what another may have written.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from .base import ANY, Commit, Key, Store, StoreUnavailable, new_version
from .datadir import SECRET_FILE, install_secret, private_tree
from .embedded import EmbeddedStore
from .redis_store import RedisStore, SharedSecret, StoreSettingError, connect, shown

__all__ = ["ANY", "Commit", "EmbeddedStore", "Key", "RedisStore", "Store", "StoreSettingError", "StoreUnavailable", "Stores", "new_version", "shown"]

# Each store's prefix in Redis (``pcp:<area>:…``), by its directory's name in the data dir.
AREAS = {
    "sessions": "s",
    "summaries": "sum",
    "embeddings": "v",
    "upstream-embeddings": "uv",
    "components": "c",
    "context": "h",
    "memory": "m",
    "memory/core": "mc",
}
LASTING = {"memory/core"}  # areas of memory: never expired
# In Redis, what a session left is kept this long after it was last written (refreshed by every
# write): a store given a memory limit evicts among these first (volatile-lru), never memory pages.
TTL_SECONDS = 30 * 86_400

log = logging.getLogger("pcp.store")


class Stores:
    def __init__(self, url: str, data: Path, *, workers: int = 1):
        self.url = url
        self.data = data
        self.client: Any = connect(url) if url else None  # StoreSettingError: the start-up stops, naming the setting
        self.shared = self.client is not None or workers > 1
        self.kept: SharedSecret | None = None
        self.keeper: threading.Thread | None = None
        self.stopping = threading.Event()

    @property
    def where(self) -> str:
        """Where the data lives, as the log may show it (a URL without its password)."""
        return shown(self.url) if self.url else str(self.data)

    def area(self, name: str) -> Store:
        """The store of one kind of value (``AREAS``)."""
        if self.client is not None:
            return RedisStore(self.client, AREAS[name], ttl=0 if name in LASTING else TTL_SECONDS)
        return EmbeddedStore(private_tree(self.data / name), shared=self.shared, cull=name == "sessions")

    def prefix(self, name: str) -> str:
        """The prefix of an area's keys in the shared store (memory pages keep their own layout under it)."""
        return f"pcp:{AREAS[name]}:"

    def secret(self) -> bytes:
        """The install's secret, which names the callers' namespaces: in the shared store, so every replica names them alike
        (held on to while the process runs: ``SharedSecret``), else in the data dir."""
        if self.client is None:
            made = not (self.data / SECRET_FILE).exists()
            secret = install_secret(self.data)
            if made and self._sessions_on_disk():
                log.error(
                    "%s was missing though the data dir holds sessions: a new secret was made, and the sessions kept under the old "
                    "one are found by no key (they are paged again). Restore the file from a backup to keep them.",
                    self.data / SECRET_FILE,
                )
            return secret
        if self.kept is None:
            self.kept = SharedSecret(self.client, self.data)
            self.kept.open()
            self.keeper = threading.Thread(target=self._keep, name="pcp-secret", daemon=True)
            self.keeper.start()
        return self.kept.secret

    def _keep(self) -> None:
        """Every ``SharedSecret.CHECK_SECONDS``: the store still holds the secret (a store that cannot be reached is asked again later)."""
        import redis

        assert self.kept is not None
        while not self.stopping.wait(SharedSecret.CHECK_SECONDS):
            try:
                self.kept.check()
            except redis.RedisError:
                pass
            except Exception:
                if not self.stopping.is_set():  # the client closed under it at the end is no news
                    log.exception("the store's install secret could not be checked")

    def _sessions_on_disk(self) -> bool:
        """Whether the data dir holds sessions of the embedded store."""
        if not (self.data / "sessions").is_dir():
            return False
        store = EmbeddedStore(self.data / "sessions")
        try:
            return next(store.keys("session"), None) is not None
        finally:
            store.close()

    def close(self) -> None:
        """Stop the keeper and close the shared client."""
        self.stopping.set()
        if self.keeper is not None:
            self.keeper.join(timeout=1.0)  # one caught asking a store that does not answer is a daemon: not waited for
        if self.client is not None:
            self.client.close()
            self.client.connection_pool.disconnect()
