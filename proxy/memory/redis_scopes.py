"""The Redis memory store's keys, and the pieces its writes are made of (``redis_store`` holds the store itself).

Every piece queues its commands on the write's MULTI/EXEC pipeline, under the
scope's lock: a write is whole or absent (the key layout: ``redis_store``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from typing import Any

from pcp_core import ConsolidatedPage, Page

from ..storage.redis_store import unavailable
from .bodies import PageBodies
from .store import Stored

__all__ = ["LOCK_SECONDS", "RedisScopes"]

_READ = ["s", "b", "n", "r", "v", "k", "w", "o", "u"]  # a row's fields as ``_stored`` reads them

LOCK_SECONDS = 60  # a scope's lock held by a process that died is free after this

_BATCH = 1000


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    """A Redis that cannot be reached is ``StoreUnavailable`` (the writer retries; a request is a 503)."""

    @functools.wraps(method)
    def guarded(self: RedisScopes, *args: Any, **kwargs: Any) -> Any:
        """The method, a Redis connection error raised as the store being unavailable."""
        try:
            return method(self, *args, **kwargs)
        except self._errors as error:
            raise unavailable(error) from None

    return guarded


class RedisScopes:
    """A Redis memory store's keys, by scope, and the pieces of its writes."""

    def __init__(self, client: Any, prefix: str, bodies: PageBodies | None = None):
        """A store on ``client``, its keys under ``prefix``."""
        import redis

        self.client = client
        self.p = prefix
        self.bodies = bodies or PageBodies()
        self._errors = (redis.ConnectionError, redis.TimeoutError)

    def _k(self, scope: str, what: str) -> str:
        """The key of ``what`` in ``scope``."""
        return f"{self.p}{scope}|{what}"

    def _row_key(self, row: int) -> str:
        """The key of the page stored at ``row``."""
        return f"{self.p}r:{row}"

    def _lock(self, scope: str) -> Any:
        """The scope's write lock."""
        return self.client.lock(self._k(scope, "lock"), timeout=LOCK_SECONDS, blocking_timeout=LOCK_SECONDS)

    def _rows_of(self, scope: str, ids: Sequence[str]) -> dict[str, int]:
        """The rows of those of ``ids`` the scope holds."""
        found: dict[str, int] = {}
        for start in range(0, len(ids), _BATCH):
            chunk = list(ids[start : start + _BATCH])
            found.update((pid, int(row)) for pid, row in zip(chunk, self.client.hmget(self._k(scope, "ids"), chunk)) if row is not None)
        return found

    def _fields(self, rows: Sequence[int], names: list[str]) -> list[list[Any]]:
        """The named fields of each row, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for row in rows:
            pipe.hmget(self._row_key(row), names)
        return pipe.execute() if rows else []

    def _insert(
        self, pipe: Any, scope: str, conversation: str, pages: Sequence[Page], vectors: dict[str, bytes], records: Collection[str] = ()
    ) -> list[Stored]:
        """Queue the pages the scope does not hold (children before their containers), and every container's edges."""
        fresh = {p.id: p for p in pages}
        absent = self.missing(scope, list(fresh))
        new = [pid for pid in fresh if pid in absent]
        first = int(self.client.incrby(self.p + "row", len(new))) - len(new) + 1 if new else 0
        now = self.clock(scope)
        added = []
        for row, pid in enumerate(new, start=first):
            page = fresh[pid]
            container = isinstance(page, ConsolidatedPage)
            record = int(pid in records)
            fields = {"s": scope, "i": pid, "c": int(container), "n": conversation, "t": page.timestamp, "b": self.bodies.encode(scope, page), "r": 0}
            fields.update(k=record, u=now, **({"v": vectors[pid]} if pid in vectors else {}))
            pipe.zadd(self._k(scope, "used"), {str(row): now})
            if record:
                pipe.hincrby(self._k(scope, "counts"), "records", 1)
            pipe.hset(self._row_key(row), mapping=fields)
            pipe.hset(self._k(scope, "ids"), pid, row)
            pipe.zadd(self._k(scope, "rows"), {str(row): row})
            pipe.zadd(self._k(scope, "time"), {f"{page.timestamp}|{row}": 0})
            pipe.hincrby(self._k(scope, "counts"), "consolidated" if container else "originals", 1)
            if pid in vectors:
                pipe.hincrby(self._k(scope, "counts"), "vectors", 1)
            added.append(Stored(row, page, conversation, 0, vectors.get(pid), bool(record), used=now))
        for page in pages:
            for child in getattr(page, "source_ids", ()):
                pipe.sadd(self._k(scope, f"parents:{child}"), page.id)
        return added

    def _own(self, pipe: Any, scope: str, conversation: str, ids: set[str]) -> None:
        """Record ``conversation`` as an owner of ``ids``."""
        for pid in ids:
            pipe.sadd(self._k(scope, f"owned:{conversation}"), pid)
            pipe.sadd(self._k(scope, f"owners:{pid}"), conversation)
        if conversation and ids:
            pipe.sadd(self._k(scope, "convs"), conversation)

    def _owners(self, scope: str, ids: Sequence[str]) -> dict[str, list[str]]:
        """The conversations that own each of ``ids``."""
        pipe = self.client.pipeline(transaction=False)
        for pid in ids:
            pipe.smembers(self._k(scope, f"owners:{pid}"))
        return {pid: [c.decode() for c in held] for pid, held in zip(ids, pipe.execute() if ids else [])}

    def _owner_counts(self, scope: str, ids: Sequence[str]) -> list[int]:
        """How many conversations own each of ``ids``."""
        pipe = self.client.pipeline(transaction=False)
        for pid in ids:
            pipe.scard(self._k(scope, f"owners:{pid}"))
        return [int(n) for n in pipe.execute()] if ids else []

    def _delete(self, pipe: Any, scope: str, ids: Sequence[str]) -> tuple[list[int], int]:
        """Queue the removal of ``ids`` (rows, edges both ways, counts) and log it; the rows and the last seq."""
        rows = self._rows_of(scope, ids)
        held = dict(zip(rows, self._fields(list(rows.values()), ["t", "c", "v", "b", "k", "o"])))
        for pid, row in rows.items():
            timestamp, container, vector, body, record, consulted = held[pid]
            pipe.zrem(self._k(scope, "used"), str(row))
            if int(record or 0):
                pipe.hincrby(self._k(scope, "counts"), "records", -1)
            if int(consulted or 0):
                pipe.hincrby(self._k(scope, "counts"), "consulted", -1)
            pipe.delete(self._row_key(row))
            pipe.hdel(self._k(scope, "ids"), pid)
            pipe.zrem(self._k(scope, "rows"), str(row))
            pipe.zrem(self._k(scope, "time"), f"{timestamp.decode()}|{row}")
            pipe.delete(self._k(scope, f"parents:{pid}"))
            for child in getattr(self.bodies.decode(scope, body), "source_ids", ()):
                pipe.srem(self._k(scope, f"parents:{child}"), pid)
            pipe.hincrby(self._k(scope, "counts"), "consolidated" if container == b"1" else "originals", -1)
            if vector is not None:
                pipe.hincrby(self._k(scope, "counts"), "vectors", -1)
        seq = self._log_removed(pipe, scope, list(rows.values()))
        return list(rows.values()), seq

    def _rewrite(self, pipe: Any, scope: str, pages: Sequence[Page], seq: int) -> tuple[list[Stored], list[int], int]:
        """Containers consolidated again: each at a new row in place of its old one (which is logged removed)."""
        rows = self._rows_of(scope, [p.id for p in pages])
        added, replaced = [], []
        for page in pages:
            if page.id not in rows:
                continue
            old = rows[page.id]
            conv, recalls, vector, body, timestamp, *use = self.client.hmget(self._row_key(old), ["n", "r", "v", "b", "t", "k", "w", "o", "u"])
            record, shown, consulted, used = (int(value or 0) for value in use)
            for child in getattr(self.bodies.decode(scope, body), "source_ids", ()):
                pipe.srem(self._k(scope, f"parents:{child}"), page.id)
            for child in getattr(page, "source_ids", ()):
                pipe.sadd(self._k(scope, f"parents:{child}"), page.id)
            row = int(self.client.incr(self.p + "row"))
            fields = {
                "s": scope,
                "i": page.id,
                "c": int(isinstance(page, ConsolidatedPage)),
                "n": conv,
                "t": page.timestamp,
                "b": self.bodies.encode(scope, page),
                "r": int(recalls or 0),
                "k": record,
                "w": shown,
                "o": consulted,
                "u": used,
            }
            if vector is not None:
                fields["v"] = vector
            pipe.delete(self._row_key(old))
            pipe.hset(self._row_key(row), mapping=fields)
            pipe.hset(self._k(scope, "ids"), page.id, row)
            pipe.zrem(self._k(scope, "rows"), str(old))
            pipe.zadd(self._k(scope, "rows"), {str(row): row})
            pipe.zrem(self._k(scope, "time"), f"{timestamp.decode()}|{old}")
            pipe.zadd(self._k(scope, "time"), {f"{page.timestamp}|{row}": 0})
            pipe.zrem(self._k(scope, "used"), str(old))
            pipe.zadd(self._k(scope, "used"), {str(row): used})
            seq = max(seq, self._log_removed(pipe, scope, [old]))
            replaced.append(old)
            added.append(Stored(row, page, conv.decode(), int(recalls or 0), vector, bool(record), shown, consulted, used))
        return added, replaced, seq

    def _log_removed(self, pipe: Any, scope: str, rows: list[int]) -> int:
        """Log ``rows`` as removed, numbered for those catching up; the last number."""
        if not rows:
            return 0
        last = int(self.client.incrby(self.p + "seq", len(rows)))
        pipe.zadd(self._k(scope, "removed"), {f"{seq}:{row}": seq for seq, row in zip(range(last - len(rows) + 1, last + 1), rows)})
        return last

    def _tidy_conversations(self, scope: str, conversations: set[str]) -> None:
        """Conversations left with no page no longer count (a count only: outside the transaction)."""
        for conv in conversations:
            if conv and not self.client.scard(self._k(scope, f"owned:{conv}")):
                self.client.srem(self._k(scope, "convs"), conv)

    @_guarded
    def missing(self, scope: str, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` the scope does not hold."""
        return set(ids) - set(self._rows_of(scope, ids))

    @_guarded
    def clock(self, scope: str) -> int:
        """The requests the scope served (each request the Memory Router gave pages to)."""
        return int(self.client.get(self._k(scope, "clock")) or 0)
