"""Memory across conversations (P-Mem), the host's side: the store, the indexes, the writer, the API."""

from .service import Memory
from .store import MemoryStore, SqliteMemoryStore, scope_key

__all__ = ["Memory", "MemoryStore", "SqliteMemoryStore", "scope_key"]
