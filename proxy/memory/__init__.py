"""Memory across conversations (P-Mem), the host's side: the store, the indexes, the writer, the API."""

from ..storage import Stores
from ..storage.sealing import Sealer
from .bodies import PageBodies
from .redis_store import RedisMemoryStore
from .service import Memory
from .sqlite_store import SqliteMemoryStore
from .store import MemoryStore, scope_key

__all__ = ["Memory", "MemoryStore", "SqliteMemoryStore", "open_memory_store", "scope_key"]


def open_memory_store(stores: Stores, sealer: Sealer) -> MemoryStore:
    """Where memory pages live, sealed with ``sealer`` and never expired: the shared store's, else a SQLite file in the data dir."""
    if stores.client is not None:
        return RedisMemoryStore(stores.client, stores.prefix("memory"), PageBodies(sealer))
    return SqliteMemoryStore(stores.data / "memory" / "memory.db", PageBodies(sealer))
