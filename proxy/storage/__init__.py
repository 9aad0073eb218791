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

from pathlib import Path
from typing import Any

from .base import ANY, Commit, Key, Store, StoreUnavailable, new_version
from .datadir import install_secret as install_secret_file
from .datadir import private_tree
from .embedded import EmbeddedStore
from .redis_store import RedisStore, StoreSettingError, connect, install_secret, shown

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


class Stores:
    def __init__(self, url: str, data: Path, *, workers: int = 1):
        self.url = url
        self.data = data
        self.client: Any = connect(url) if url else None  # StoreSettingError: the start-up stops, naming the setting
        self.shared = self.client is not None or workers > 1

    @property
    def where(self) -> str:
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
        """The install's secret, which names the callers' namespaces: in the shared store, so every replica names them alike."""
        return install_secret(self.client) if self.client is not None else install_secret_file(self.data)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client.connection_pool.disconnect()
