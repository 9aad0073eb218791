"""Memory pages in Redis: ``MemoryStore`` for replicas that share one memory.

The same model as the SQLite store (``proxy.memory.sqlite_store``): every page has
a row that only grows (one counter for the store), every removal is logged
with a seq, and a scope's indexes catch up from the (row, seq) they reflect.
Keys, under ``pcp:m:`` and the scope (the caller's namespace, ``/``, the
scope's name; ``|`` is in no scope's name)::

    r:<row>                 hash: scope, id, container, conversation, timestamp, body, vector, recalls,
                            record, shown, consulted, used (the metabolism's: ``pcp_core.memory.fading``)
    <scope>|ids             hash: page id -> row
    <scope>|rows            sorted set of the scope's rows (by row)
    <scope>|time            sorted set "timestamp|row" (by text: the periods a question names)
    <scope>|owned:<conv>    set: the pages a conversation holds;  <scope>|owners:<id>: the conversations holding a page
    <scope>|parents:<id>    set: the containers holding a page
    <scope>|convs, |forgotten, |removed ("seq:row" by seq), |counts (originals, consolidated, vectors, records, consulted)
    <scope>|clock           the requests the scope served;  <scope>|used: sorted set of rows by the clock when last used

A scope's writes take its lock (``<scope>|lock``, expiring): they read what
they change, allocate rows and log removals under it, and apply everything
in one MULTI/EXEC, so a write is whole or absent, and a scope's rows are
committed in the order they were allocated — an index that has applied
every row up to n has missed none below it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence

import msgspec

from pcp_core import Page
from pcp_core.memory import MemoryUse

from .redis_scopes import _BATCH, _READ, RedisScopes, _guarded
from .store import Stored, Written, scope_key

__all__ = ["RedisMemoryStore"]


class RedisMemoryStore(RedisScopes):
    """``MemoryStore`` in Redis: what memory reads and writes, each write under its scope's lock (``RedisScopes``)."""

    # -- reading -------------------------------------------------------------------------

    @_guarded
    def pages(self, scope: str, ids: Sequence[str]) -> list[Page]:
        """The pages of ``ids`` the scope holds, in that order."""
        rows = self._rows_of(scope, ids)
        bodies = self._fields([rows[pid] for pid in ids if pid in rows], ["b"])
        return [page for (body,) in bodies if body is not None and (page := self.bodies.decode(scope, body)) is not None]

    @_guarded
    def stored(self, scope: str, rows: Sequence[int]) -> list[Stored]:
        """The stored pages at ``rows`` that belong to ``scope``, with what the store keeps beside them."""
        found = []
        for row, (held, body, conv, recalls, vector, *use) in zip(rows, self._fields(rows, _READ)):
            if held is not None and held.decode() == scope and (page := self.bodies.decode(scope, body)) is not None:
                record, shown, consulted, used = (int(value or 0) for value in use)
                found.append(Stored(row, page, conv.decode(), int(recalls or 0), vector, bool(record), shown, consulted, used))
        return found

    @_guarded
    def parents(self, scope: str, ids: Sequence[str]) -> dict[str, list[str]]:
        """The containers each of ``ids`` is a page of."""
        pipe = self.client.pipeline(transaction=False)
        for pid in ids:
            pipe.smembers(self._k(scope, f"parents:{pid}"))
        return {pid: sorted(p.decode() for p in held) for pid, held in zip(ids, pipe.execute() if ids else []) if held}

    @_guarded
    def listing(self, scope: str, after: int, limit: int) -> list[Stored]:
        """Up to ``limit`` stored pages after row ``after``, in row order, without their vectors."""
        rows = [int(r) for r in self.client.zrangebyscore(self._k(scope, "rows"), f"({after}", "+inf", start=0, num=limit)]
        return [msgspec.structs.replace(s, vector=None) for s in self.stored(scope, rows)]

    @_guarded
    def in_period(self, scope: str, start: str, end: str, limit: int) -> list[int]:
        """The rows of pages written from ``start`` to before ``end``, at most ``limit``."""
        members = self.client.zrangebylex(self._k(scope, "time"), f"[{start}", f"({end}", start=0, num=limit)
        return [int(member.rsplit(b"|", 1)[1]) for member in members]

    @_guarded
    def counts(self, scope: str, faded_before: int = 0) -> dict[str, int]:
        """The scope's counts of pages, records, conversations and forgotten turns."""
        originals, consolidated, records, consulted = self.client.hmget(self._k(scope, "counts"), ["originals", "consolidated", "records", "consulted"])
        return {
            "originals": int(originals or 0),
            "consolidated": int(consolidated or 0),
            "conversations": int(self.client.scard(self._k(scope, "convs"))),
            "forgotten_turns": int(self.client.scard(self._k(scope, "forgotten"))),
            "records": int(records or 0),
            "requests": self.clock(scope),
            "consulted": int(consulted or 0),
            "faded": int(self.client.zcount(self._k(scope, "used"), "-inf", f"({faded_before}")),
        }

    @_guarded
    def metabolise(self, scope: str, use: MemoryUse) -> int:
        """A request's use of the scope's pages: its clock ticks; the pages given, shown and consulted count it."""
        now = int(self.client.incr(self._k(scope, "clock")))
        rows = self._rows_of(scope, list(dict.fromkeys([*use.given, *use.shown, *use.consulted])))
        pipe = self.client.pipeline(transaction=False)
        for ids, field in ((use.given, "r"), (use.shown, "w")):
            for pid in (pid for pid in ids if pid in rows):
                pipe.hincrby(self._row_key(rows[pid]), field, 1)
        pipe.execute()
        opened = [rows[pid] for pid in use.consulted if pid in rows]
        pipe = self.client.pipeline(transaction=False)
        for row in opened:
            pipe.hincrby(self._row_key(row), "o", 1)
            pipe.hset(self._row_key(row), "u", now)
            pipe.zadd(self._k(scope, "used"), {str(row): now})
        counted = pipe.execute()[::3] if opened else []
        if firsts := sum(n == 1 for n in counted):  # pages opened for the first time: one more page ever consulted each
            self.client.hincrby(self._k(scope, "counts"), "consulted", firsts)
        return now

    @_guarded
    def scopes(self, namespace: str) -> list[str]:
        """The names of ``namespace``'s scopes holding a page or a forgotten turn (a SCAN of their keys: for
        the inspector and the API's listing, never on a request's path)."""
        start = self.p + scope_key(namespace, "")
        names = set()
        for what in ("ids", "forgotten"):
            for key in self.client.scan_iter(match=_glob_escaped(start) + "*|" + what, count=1000):
                names.add(key.decode()[len(start) : -len(what) - 1])
        return sorted(names)

    @_guarded
    def holds(self, scope: str) -> bool:
        """Whether the scope holds any page."""
        return bool(self.client.exists(self._k(scope, "ids")))

    @_guarded
    def rows_after(self, scope: str, row: int) -> int:
        """How many of the scope's pages were written after ``row``."""
        return int(self.client.zcount(self._k(scope, "rows"), f"({row}", "+inf"))

    @_guarded
    def has_vectors(self, scope: str) -> bool:
        """Whether any of the scope's pages has a vector."""
        return int(self.client.hget(self._k(scope, "counts"), "vectors") or 0) > 0

    @_guarded
    def forgotten(self, scope: str) -> set[str]:
        """The hashes of the scope's forgotten turns."""
        return {h.decode() for h in self.client.smembers(self._k(scope, "forgotten"))}

    @_guarded
    def watermark(self) -> tuple[int, int]:
        """The last row written and the last removal's number, store-wide."""
        row, seq = self.client.mget([self.p + "row", self.p + "seq"])
        return int(row or 0), int(seq or 0)

    @_guarded
    def changes(self, scope: str, after_row: int, after_seq: int) -> tuple[Iterator[Stored], list[int], int]:
        """What an index saved at (``after_row``, ``after_seq``) lacks: the pages added since, the rows removed since, and the last seq."""
        logged = self.client.zrangebyscore(self._k(scope, "removed"), f"({after_seq}", "+inf", withscores=True)
        removed = [int(member.split(b":")[1]) for member, _ in logged]
        last = int(logged[-1][1]) if logged else after_seq
        rows = [int(r) for r in self.client.zrangebyscore(self._k(scope, "rows"), f"({after_row}", "+inf")]
        return self._batched(scope, rows), removed, last

    def _batched(self, scope: str, rows: list[int]) -> Iterator[Stored]:
        """The stored pages at ``rows``, read in batches."""
        for start in range(0, len(rows), _BATCH):
            yield from self.stored(scope, rows[start : start + _BATCH])

    # -- writing (one process at a time per scope: its lock) -------------------------------
    @_guarded
    def write(self, scope: str, conversation: str, pages: Sequence[Page], vectors: dict[str, bytes], records: Collection[str] = ()) -> Written:
        """The conversation's pages are now ``pages``: new ones added, those it no longer holds and no one else does removed."""
        with self._lock(scope):
            before = {m.decode() for m in self.client.smembers(self._k(scope, f"owned:{conversation}"))}
            mine = {page.id for page in pages}
            gone = sorted(before - mine)
            orphans = [pid for pid, owners in zip(gone, self._owner_counts(scope, gone)) if owners <= 1]
            pipe = self.client.pipeline(transaction=True)
            added = self._insert(pipe, scope, conversation, pages, vectors, records)
            self._own(pipe, scope, conversation, mine - before)
            for pid in gone:
                pipe.srem(self._k(scope, f"owned:{conversation}"), pid)
                pipe.srem(self._k(scope, f"owners:{pid}"), conversation)
            if conversation and not mine:
                pipe.srem(self._k(scope, "convs"), conversation)
            removed, seq = self._delete(pipe, scope, orphans)
            pipe.execute()
        return Written(added=added, removed=removed, seq=seq)

    @_guarded
    def add(self, scope: str, pages: Sequence[Page], vectors: dict[str, bytes], owner: str = "", records: Collection[str] = ()) -> Written:
        """Pages no conversation writes (the consolidator's, an import's), children before their containers."""
        with self._lock(scope):
            pipe = self.client.pipeline(transaction=True)
            added = self._insert(pipe, scope, owner, pages, vectors, records)
            self._own(pipe, scope, owner, {page.id for page in pages})
            pipe.execute()
        return Written(added=added)

    @_guarded
    def remove(self, scope: str, ids: Sequence[str], rewritten: Sequence[Page] = (), hashes: Iterable[str] = ()) -> Written:
        """Forget ``ids`` for good; ``rewritten`` containers replace their own at new rows; ``hashes``: forgotten turns."""
        with self._lock(scope):
            pipe = self.client.pipeline(transaction=True)
            hashes = list(hashes)
            if hashes:
                pipe.sadd(self._k(scope, "forgotten"), *hashes)
            owners = self._owners(scope, ids)
            removed, seq = self._delete(pipe, scope, list(ids))
            for pid, convs in owners.items():
                for conv in convs:
                    pipe.srem(self._k(scope, f"owned:{conv}"), pid)
                pipe.delete(self._k(scope, f"owners:{pid}"))
            added, replaced, seq = self._rewrite(pipe, scope, rewritten, seq)
            pipe.execute()
            self._tidy_conversations(scope, {c for convs in owners.values() for c in convs})
        return Written(added=added, removed=[*removed, *replaced], seq=seq)

    @_guarded
    def drop(self, scope: str) -> int:
        """Everything of the scope removed; how many pages went."""
        with self._lock(scope):
            rows = [int(r) for r in self.client.zrange(self._k(scope, "rows"), 0, -1)]
            keys = [k for k in self.client.scan_iter(match=f"{self.p}{scope}|*", count=1000) if not k.endswith((b"|removed", b"|lock"))]
            pipe = self.client.pipeline(transaction=True)
            for start in range(0, len(keys), _BATCH):
                pipe.delete(*keys[start : start + _BATCH])
            for row in rows:
                pipe.delete(self._row_key(row))
            self._log_removed(pipe, scope, rows)
            pipe.execute()
        return len(rows)

    def close(self) -> None:
        """Nothing to close: the client is the process's."""
        pass  # the client is the process's


def _glob_escaped(text: str) -> str:
    """``text`` matched as it is by a Redis glob pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
