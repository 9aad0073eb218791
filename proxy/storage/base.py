"""The one interface the proxy's stores are written against: bytes by key, and a conditional commit.

Sessions, the summary cache, the vector cache, components and Hybrid state
keep their own rules (what a key holds, how a value is sealed, what stays
in memory) and ask a ``Store`` only for this: read values, write values,
claim a key for a while, and commit several writes at once *if* a version
key still holds what the writer read. ``EmbeddedStore`` (diskcache, under
``PCP_DATA_DIR``) and ``RedisStore`` (``PCP_STORE=redis://…``) implement it.

A key is a tuple of strings (and ints): its first item names what it holds
(``"session"``, ``"part"``, …), the caller's namespace usually its second.
Values are bytes. Every call blocks: stores are called from threads, never
on the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from ..errors import PcpError

__all__ = ["ANY", "Commit", "Key", "Store", "StoreUnavailable", "new_version"]

Key = tuple[str | int | bytes, ...]  # bytes: a digest, as a text's vector is named
ANY = "*"  # a commit that expects this writes whatever version is held (tokens are hex: none is "*")


class StoreUnavailable(PcpError):
    """The shared store cannot be reached: a protocol-mode request is a 503 until it is back (passthrough is not affected)."""

    status = 503
    type = "server_error"

    def __init__(self, detail: str = ""):
        why = f" ({detail})" if detail else ""
        super().__init__(f"the proxy's store (setting store, env PCP_STORE) cannot be reached{why}; retry shortly", code="store_unavailable")


def new_version() -> str:
    """A version token: a write says which version it replaces, so two writers never both win."""
    return os.urandom(8).hex()


class Commit:
    """Writes that land together or not at all, if ``version`` still holds ``expected`` ("" : nothing).

    ``trims``: part keys from which on (``key[-1]`` counting up) every key that
    exists is deleted, as a list stored in parts shrinks; ``keep``: keys that
    stay as they are but belong to what is written (a store with expiry keeps
    them as long as the rest).
    """

    __slots__ = ("expected", "keep", "new", "trims", "version", "writes")

    def __init__(self, version: Key, expected: str, new: str, writes: Mapping[Key, bytes], trims: Sequence[Key] = (), keep: Sequence[Key] = ()):
        self.version, self.expected, self.new = version, expected, new
        self.writes, self.trims, self.keep = writes, trims, keep


class Store(Protocol):
    """What every store of the proxy asks of where it keeps its values."""

    shared: bool  # other processes (workers, replicas) read and write it too

    def get(self, key: Key) -> bytes | None:
        """The value at ``key``; None: none."""

    def get_many(self, keys: Sequence[Key]) -> list[bytes | None]:
        """The values at ``keys``, in order."""

    def set_many(self, items: Mapping[Key, bytes]) -> None:
        """Write every item."""

    def delete(self, key: Key) -> None:
        """Remove ``key``."""

    def contains(self, key: Key) -> bool:
        """Whether ``key`` holds a value."""

    def claim(self, key: Key, seconds: float) -> bool:
        """Take ``key`` for ``seconds`` if no one holds it: who encodes a text, say."""
        ...

    def commit(self, commit: Commit) -> bool:
        """Apply ``commit`` if its version key holds what it expects; False (nothing written) if not."""
        ...

    def keys(self, kind: str) -> Iterator[Key]:
        """Every key whose first item is ``kind``."""
        ...

    def close(self) -> None:
        """Let go of the store."""
