"""The embedded store: diskcache (SQLite plus files) in a directory under ``PCP_DATA_DIR``.

Several processes may share the directory (``pcp-proxy serve --workers N``):
SQLite serialises their writes, and a ``commit`` checks its version key and
writes inside one transaction (``BEGIN IMMEDIATE``), so of two workers that
read one version only the first to commit wins.

A commit survives a kill at any step: write new, then switch, then collect.
diskcache keeps a value over 32 kB in a file of its own, written before the
transaction; the rows switch to the new files when SQLite commits; only then
are the files of the values replaced or deleted removed. (Inside a
transaction of its own, diskcache removes a replaced value's file as soon as
the row is set, before the commit: a kill in between left the row of the old
value, whose file was gone, and the session was lost.) A kill before the
commit leaves the old rows with their files, and new files no row names; a
kill after it, old files no row names. Either costs disk, never a value.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import diskcache

from .base import ANY, Commit, Key
from .datadir import private_tree

__all__ = ["EmbeddedStore"]

_SEPARATOR = "\x1f"


class _StringKeys(diskcache.Disk):
    """Keys (tuples of strings, and a part's number) kept as one string; files removed only once what replaced them is committed.

    diskcache pickles a tuple key and optimises the pickle in Python, holding
    the interpreter while a request computes. A key of one
    item is kept as that item, as the caches kept theirs before.
    """

    def __init__(self, directory: str, **settings: object):
        super().__init__(directory, **settings)
        self._held = threading.local()  # per thread, as diskcache's transactions are

    @contextmanager
    def holding(self) -> Iterator[None]:
        """While this thread's transaction runs, the files it would remove are kept; removed after it commits.

        A transaction that fails instead removes the files it wrote, which no row names.
        """
        self._held.removed, self._held.written = [], []
        try:
            yield
        except BaseException:
            written, self._held.removed, self._held.written = self._held.written, None, None
            for name in written:
                super().remove(name)
            raise
        removed, self._held.removed, self._held.written = self._held.removed, None, None
        for name in removed:
            super().remove(name)

    def remove(self, file_path: str) -> None:
        """Remove a value's file, or note it for after the transaction."""
        removed = getattr(self._held, "removed", None)
        if removed is None:
            super().remove(file_path)
        else:
            removed.append(file_path)

    def store(self, value: object, read: bool, key: object = diskcache.core.UNKNOWN) -> tuple[int, int, str | None, object]:
        """Store ``value``, noting a file it writes within a transaction."""
        stored = super().store(value, read, key=key)
        written = getattr(self._held, "written", None)
        if written is not None and stored[2] is not None:
            written.append(stored[2])
        return stored

    def put(self, key: object) -> tuple[object, bool]:
        """A key as the database keeps it: a tuple joined."""
        return super().put(_SEPARATOR.join(map(str, key)) if type(key) is tuple else key)

    def get(self, key: object, raw: bool) -> object:
        """A key as the database gives it back: a joined tuple split again."""
        key = super().get(key, raw)
        if not isinstance(key, str) or _SEPARATOR not in key:
            return key
        fields: list[str | int] = list(key.split(_SEPARATOR))
        if fields[0] == "part":
            fields[-1] = int(fields[-1])
        return tuple(fields)


def _key(key: Key) -> object:
    """A key as diskcache keeps it: a one-part key by its part."""
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
        """The value at ``key``; None: none."""
        value = self.cache.get(_key(key))
        return value.encode() if isinstance(value, str) else value

    def get_many(self, keys: Sequence[Key]) -> list[bytes | None]:
        """The values at ``keys``, in order."""
        return [self.get(key) for key in keys]

    def set_many(self, items: Mapping[Key, bytes]) -> None:
        """Write every item, in one transaction."""
        if len(items) == 1:
            ((key, value),) = items.items()
            self.cache.set(_key(key), value)
            return
        with self._transaction():
            for key, value in items.items():
                self.cache.set(_key(key), value)

    def delete(self, key: Key) -> None:
        """Remove ``key``."""
        self.cache.delete(_key(key))

    def contains(self, key: Key) -> bool:
        """Whether ``key`` holds a value."""
        return _key(key) in self.cache

    def claim(self, key: Key, seconds: float) -> bool:
        """Hold ``key`` for ``seconds`` unless another holds it: whether this did."""
        return bool(self.cache.add(_key(key), b"", expire=seconds))

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One SQLite transaction; the files of the values it replaced or deleted are removed once it has committed."""
        with self.cache.disk.holding(), self.cache.transact():
            yield

    def commit(self, commit: Commit) -> bool:
        """Write a commit's items if the version is the one it expects, in one transaction: whether it was."""
        with self._transaction():
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
        """Close the cache."""
        self.cache.close()
