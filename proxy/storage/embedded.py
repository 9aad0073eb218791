"""The embedded store: diskcache (SQLite plus files) in a directory under ``PCP_DATA_DIR``.

Several processes may share the directory (``pcp-proxy serve --workers N``):
SQLite serialises their writes, and a ``commit`` checks its version key and
writes inside one transaction (``BEGIN IMMEDIATE``), so of two workers that
read one version only the first to commit wins.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import diskcache

from .base import ANY, Commit, Key
from .datadir import private_tree

__all__ = ["EmbeddedStore"]

_SEPARATOR = "\x1f"


class _StringKeys(diskcache.Disk):
    """Keys (tuples of strings, and a part's number) kept as one string.

    diskcache pickles a tuple key and optimises the pickle in Python: ~0.2 ms
    a key, holding the interpreter while a request computes. A key of one
    item is kept as that item, as the caches kept theirs before.
    """

    def put(self, key: object) -> tuple[object, bool]:
        return super().put(_SEPARATOR.join(map(str, key)) if type(key) is tuple else key)

    def get(self, key: object, raw: bool) -> object:
        key = super().get(key, raw)
        if not isinstance(key, str) or _SEPARATOR not in key:
            return key
        fields: list[str | int] = list(key.split(_SEPARATOR))
        if fields[0] == "part":
            fields[-1] = int(fields[-1])
        return tuple(fields)


def _key(key: Key) -> object:
    return key[0] if len(key) == 1 else key


class EmbeddedStore:
    """``Store`` on one diskcache directory. ``cull``: evict (past diskcache's 1 GB) once per commit, not per entry."""

    def __init__(self, directory: Path, *, shared: bool = False, cull: bool = False):
        private_tree(directory)
        self.shared = shared
        self.directory = directory
        self.cull = cull
        self.cache = diskcache.Cache(str(directory), disk=_StringKeys, **({"cull_limit": 0} if cull else {}))

    def get(self, key: Key) -> bytes | None:
        value = self.cache.get(_key(key))
        return value.encode() if isinstance(value, str) else value

    def get_many(self, keys: Sequence[Key]) -> list[bytes | None]:
        return [self.get(key) for key in keys]

    def set_many(self, items: Mapping[Key, bytes]) -> None:
        if len(items) == 1:
            ((key, value),) = items.items()
            self.cache.set(_key(key), value)
            return
        with self.cache.transact():
            for key, value in items.items():
                self.cache.set(_key(key), value)

    def delete(self, key: Key) -> None:
        self.cache.delete(_key(key))

    def contains(self, key: Key) -> bool:
        return _key(key) in self.cache

    def claim(self, key: Key, seconds: float) -> bool:
        return bool(self.cache.add(_key(key), b"", expire=seconds))

    def commit(self, commit: Commit) -> bool:
        with self.cache.transact():
            held = self.cache.get(commit.version)
            if commit.expected != ANY and (held.decode() if isinstance(held, bytes) else held or "") != commit.expected:
                return False
            for key, value in commit.writes.items():
                self.cache.set(_key(key), value)
            for first in commit.trims:  # a list rebuilt shorter leaves no parts behind
                stale = first
                while self.cache.delete(stale):
                    stale = (*stale[:-1], int(stale[-1]) + 1)
            self.cache.set(commit.version, commit.new.encode())
        if self.cull:
            self.cache.cull()
        return True

    def keys(self, kind: str) -> Iterator[Key]:
        """Keys whose first item is ``kind`` ("": every key, a key of one item as a tuple of one)."""
        for key in self.cache.iterkeys():
            if not kind:
                yield key if type(key) is tuple else (key,)
            elif type(key) is tuple and key[0] == kind:
                yield key

    def close(self) -> None:
        self.cache.close()
