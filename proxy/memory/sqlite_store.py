"""The memory store in SQLite (``MemoryStore``'s default), beside the data directory's other stores.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a committed write
survives the process being killed (not, on some filesystems, the machine
losing power mid-checkpoint). Every page has a ``row`` that only grows, and
every removal is logged with a ``seq`` (``store``).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path

from pcp_core import ConsolidatedPage, Page
from pcp_core.memory import MemoryUse

from .bodies import PageBodies
from .store import Stored, Written, scope_key

__all__ = ["SqliteMemoryStore"]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS pages(
    row INTEGER PRIMARY KEY AUTOINCREMENT,
    scope TEXT NOT NULL, id TEXT NOT NULL, container INTEGER NOT NULL,
    conversation TEXT NOT NULL, timestamp TEXT NOT NULL,
    body BLOB NOT NULL, vector BLOB, recalls INTEGER NOT NULL DEFAULT 0,
    UNIQUE(scope, id));
CREATE INDEX IF NOT EXISTS pages_time ON pages(scope, timestamp);
CREATE TABLE IF NOT EXISTS owners(scope TEXT, conversation TEXT, id TEXT, PRIMARY KEY(scope, conversation, id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS owners_page ON owners(scope, id);
CREATE TABLE IF NOT EXISTS edges(scope TEXT, child TEXT, parent TEXT, PRIMARY KEY(scope, child, parent)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS edges_parent ON edges(scope, parent);
CREATE TABLE IF NOT EXISTS forgotten(scope TEXT, hash TEXT, PRIMARY KEY(scope, hash)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS removed(seq INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL, row INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS removed_scope ON removed(scope, seq);
CREATE TABLE IF NOT EXISTS clocks(scope TEXT PRIMARY KEY, requests INTEGER NOT NULL) WITHOUT ROWID;
"""
# Columns added since the first schema (the metabolism's, ``pcp_core.memory.fading``, and records).
_ADDED = {name: "INTEGER NOT NULL DEFAULT 0" for name in ("record", "shown", "consulted", "used")}
_READ = "row, body, conversation, recalls, vector, record, shown, consulted, used"  # what ``_stored`` reads, in order
_CHUNK = 500  # ids per IN (...) query: SQLite's variable limit is far above it


class SqliteMemoryStore:
    """Memory in one SQLite file; a connection per thread (WAL: readers never wait on the writer)."""

    def __init__(self, path: Path, bodies: PageBodies | None = None):
        """A store in the SQLite file at ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.bodies = bodies or PageBodies()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        db = self._db()
        db.executescript(_SCHEMA)
        have = {name for _, name, *_ in db.execute("PRAGMA table_info(pages)")}
        for name, kind in _ADDED.items():  # a store written before the column was added gains it
            if name not in have:
                db.execute(f"ALTER TABLE pages ADD COLUMN {name} {kind}")

    def _db(self) -> sqlite3.Connection:
        """This thread's connection, opened once (WAL)."""
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()

    # -- writing (one thread) --------------------------------------------------------
    def missing(self, scope: str, ids: Sequence[str]) -> set[str]:
        """Those of ``ids`` the scope does not hold."""
        return self._missing(self._db(), scope, ids)

    def _missing(self, db: sqlite3.Connection, scope: str, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` the scope does not hold, read on ``db``."""
        found = {pid for chunk in _chunks(ids) for (pid,) in db.execute(f"SELECT id FROM pages WHERE scope=? AND id IN ({_marks(chunk)})", (scope, *chunk))}
        return set(ids) - found

    def write(self, scope: str, conversation: str, pages: Sequence[Page], vectors: dict[str, bytes], records: Collection[str] = ()) -> Written:
        """The conversation's pages are now ``pages`` (those of ``records`` new pages that inform nothing): new ones
        added, those it no longer holds and no one else does removed."""
        db = self._db()
        with _transaction(db):
            before = {pid for (pid,) in db.execute("SELECT id FROM owners WHERE scope=? AND conversation=?", (scope, conversation))}
            added = self._insert(db, scope, conversation, pages, vectors, records)
            mine = {page.id for page in pages}
            db.executemany("INSERT OR IGNORE INTO owners VALUES (?,?,?)", [(scope, conversation, pid) for pid in mine - before])
            gone = sorted(before - mine)
            db.executemany("DELETE FROM owners WHERE scope=? AND conversation=? AND id=?", [(scope, conversation, pid) for pid in gone])
            orphans = [pid for pid in gone if db.execute("SELECT 1 FROM owners WHERE scope=? AND id=? LIMIT 1", (scope, pid)).fetchone() is None]
            removed = self._delete(db, scope, orphans)
            seq = _last_seq(db, scope) if removed else 0
        return Written(added=added, removed=removed, seq=seq)

    def add(self, scope: str, pages: Sequence[Page], vectors: dict[str, bytes], owner: str = "", records: Collection[str] = ()) -> Written:
        """Pages no conversation writes (the consolidator's, an import's), children before their containers."""
        db = self._db()
        with _transaction(db):
            added = self._insert(db, scope, owner, pages, vectors, records)
            db.executemany("INSERT OR IGNORE INTO owners VALUES (?,?,?)", [(scope, owner, page.id) for page in pages])
        return Written(added=added)

    def remove(self, scope: str, ids: Sequence[str], rewritten: Sequence[Page] = (), hashes: Iterable[str] = ()) -> Written:
        """Forget ``ids`` for good: their rows, claims and edges; ``rewritten`` containers replace their own
        (consolidated again without them, at a new row: the indexes read it anew); ``hashes`` are the
        forgotten turns a write-back strips from now on."""
        db = self._db()
        with _transaction(db):
            db.executemany("INSERT OR IGNORE INTO forgotten VALUES (?,?)", [(scope, h) for h in hashes])
            removed = self._delete(db, scope, ids)
            db.executemany("DELETE FROM owners WHERE scope=? AND id=?", [(scope, pid) for pid in ids])
            added = []
            for page in rewritten:
                query = "SELECT row, conversation, recalls, vector, record, shown, consulted, used FROM pages WHERE scope=? AND id=?"
                old = db.execute(query, (scope, page.id)).fetchone()
                if old is None:
                    continue
                db.execute("DELETE FROM pages WHERE row=?", (old[0],))
                db.execute("INSERT INTO removed(scope, row) VALUES (?,?)", (scope, old[0]))
                cursor = db.execute(
                    "INSERT INTO pages(scope, id, container, conversation, timestamp, body, vector, recalls, record, shown, consulted, used)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (scope, page.id, isinstance(page, ConsolidatedPage), old[1], page.timestamp, self.bodies.encode(scope, page), old[3], old[2], *old[4:]),
                )
                db.execute("DELETE FROM edges WHERE scope=? AND parent=?", (scope, page.id))
                db.executemany("INSERT OR IGNORE INTO edges VALUES (?,?,?)", [(scope, child, page.id) for child in getattr(page, "source_ids", ())])
                removed.append(old[0])
                added.append(Stored(int(cursor.lastrowid or 0), page, old[1], old[2], old[3], bool(old[4]), *old[5:]))
            seq = _last_seq(db, scope) if removed else 0
        return Written(added=added, removed=removed, seq=seq)

    def _insert(
        self, db: sqlite3.Connection, scope: str, conversation: str, pages: Sequence[Page], vectors: dict[str, bytes], records: Collection[str] = ()
    ) -> list[Stored]:
        """Insert the pages the scope does not hold (dedup by id, a content hash); every container's edges."""
        fresh = {p.id: p for p in pages}
        absent = self._missing(db, scope, list(fresh))
        new = [pid for pid in fresh if pid in absent]  # in the order given: children before their containers
        now = self._clock(db, scope)  # a page's disuse counts from its writing
        db.executemany(
            "INSERT INTO pages(scope, id, container, conversation, timestamp, body, vector, record, used) VALUES (?,?,?,?,?,?,?,?,?)",
            [
                (
                    scope,
                    pid,
                    isinstance(fresh[pid], ConsolidatedPage),
                    conversation,
                    fresh[pid].timestamp,
                    self.bodies.encode(scope, fresh[pid]),
                    vectors.get(pid),
                    pid in records,
                    now,
                )
                for pid in new
            ],
        )
        added: list[Stored] = []
        for chunk in _chunks(new):
            for row, pid in db.execute(f"SELECT row, id FROM pages WHERE scope=? AND id IN ({_marks(chunk)})", (scope, *chunk)):
                added.append(Stored(row, fresh[pid], conversation, 0, vectors.get(pid), pid in records, used=now))
        edges = [(scope, child, p.id) for p in pages if isinstance(p, ConsolidatedPage) for child in p.source_ids]
        db.executemany("INSERT OR IGNORE INTO edges VALUES (?,?,?)", edges)
        return sorted(added, key=lambda s: s.row)

    def _delete(self, db: sqlite3.Connection, scope: str, ids: Sequence[str]) -> list[int]:
        """``ids`` deleted with their edges and logged as removed; their rows."""
        rows: list[int] = []
        for chunk in _chunks(list(ids)):
            rows += [row for (row,) in db.execute(f"SELECT row FROM pages WHERE scope=? AND id IN ({_marks(chunk)})", (scope, *chunk))]
            db.execute(f"DELETE FROM pages WHERE scope=? AND id IN ({_marks(chunk)})", (scope, *chunk))
            db.execute(f"DELETE FROM edges WHERE scope=? AND (child IN ({_marks(chunk)}) OR parent IN ({_marks(chunk)}))", (scope, *chunk, *chunk))
        db.executemany("INSERT INTO removed(scope, row) VALUES (?,?)", [(scope, row) for row in rows])
        return rows

    def metabolise(self, scope: str, use: MemoryUse) -> int:
        """A request's use of the scope's pages: its clock ticks, the pages given, shown and consulted count it; the clock."""
        db = self._db()
        with _transaction(db):
            now = self._clock(db, scope) + 1
            db.execute("INSERT OR REPLACE INTO clocks VALUES (?,?)", (scope, now))
            db.executemany("UPDATE pages SET recalls = recalls + 1 WHERE scope=? AND id=?", [(scope, pid) for pid in use.given])
            db.executemany("UPDATE pages SET shown = shown + 1 WHERE scope=? AND id=?", [(scope, pid) for pid in use.shown])
            db.executemany("UPDATE pages SET consulted = consulted + 1, used = ? WHERE scope=? AND id=?", [(now, scope, pid) for pid in use.consulted])
        return now

    def clock(self, scope: str) -> int:
        """The requests the scope served (each request the Memory Router gave pages to)."""
        return self._clock(self._db(), scope)

    def _clock(self, db: sqlite3.Connection, scope: str) -> int:
        """The scope's request clock, read on ``db``."""
        found = db.execute("SELECT requests FROM clocks WHERE scope=?", (scope,)).fetchone()
        return int(found[0]) if found else 0

    def drop(self, scope: str) -> int:
        """Everything of the scope removed; how many pages went."""
        db = self._db()
        with _transaction(db):
            rows = [row for (row,) in db.execute("SELECT row FROM pages WHERE scope=?", (scope,))]
            for table in ("pages", "owners", "edges", "forgotten", "clocks"):
                db.execute(f"DELETE FROM {table} WHERE scope=?", (scope,))
            db.executemany("INSERT INTO removed(scope, row) VALUES (?,?)", [(scope, row) for row in rows])
        return len(rows)

    # -- reading (any thread) --------------------------------------------------------
    def pages(self, scope: str, ids: Sequence[str]) -> list[Page]:
        """The pages of ``ids`` the scope holds, in the order asked."""
        found: dict[str, Page] = {}
        for chunk in _chunks(list(ids)):
            for pid, body in self._db().execute(f"SELECT id, body FROM pages WHERE scope=? AND id IN ({_marks(chunk)})", (scope, *chunk)):
                if (page := self.bodies.decode(scope, body)) is not None:
                    found[pid] = page
        return [found[pid] for pid in ids if pid in found]

    def stored(self, scope: str, rows: Sequence[int]) -> list[Stored]:
        """The pages at ``rows`` that are still there, in the order asked."""
        found: dict[int, Stored] = {}
        for chunk in _chunks(list(rows)):
            # By row alone (the primary key): with the scope in the condition SQLite may walk the scope's index instead.
            query = f"SELECT scope, {_READ} FROM pages WHERE row IN ({_marks(chunk)})"
            rows_found = self._db().execute(query, chunk)
            found.update((stored.row, stored) for held, *values in rows_found if held == scope and (stored := self._stored(scope, *values)) is not None)
        return [found[row] for row in rows if row in found]

    def parents(self, scope: str, ids: Sequence[str]) -> dict[str, list[str]]:
        """The containers each of ``ids`` is a page of."""
        out: dict[str, list[str]] = {}
        for chunk in _chunks(list(ids)):
            for child, parent in self._db().execute(f"SELECT child, parent FROM edges WHERE scope=? AND child IN ({_marks(chunk)})", (scope, *chunk)):
                out.setdefault(child, []).append(parent)
        return out

    def listing(self, scope: str, after: int, limit: int) -> list[Stored]:
        """Up to ``limit`` stored pages after row ``after``, in row order, without their vectors."""
        query = f"SELECT {_READ.replace('vector', 'NULL')} FROM pages WHERE scope=? AND row > ? ORDER BY row LIMIT ?"
        return [stored for values in self._db().execute(query, (scope, after, limit)) if (stored := self._stored(scope, *values)) is not None]

    def in_period(self, scope: str, start: str, end: str, limit: int) -> list[int]:
        """Rows of pages written from ``start`` to before ``end`` (ISO timestamps compare as strings)."""
        query = "SELECT row FROM pages WHERE scope=? AND timestamp >= ? AND timestamp < ? LIMIT ?"
        return [row for (row,) in self._db().execute(query, (scope, start, end, limit))]

    def counts(self, scope: str, faded_before: int = 0) -> dict[str, int]:
        """Pages by kind, conversations, forgotten turns; and the metabolism's: records, the clock, pages ever
        consulted, and pages neither written nor consulted since the clock stood at ``faded_before``."""
        db = self._db()
        query = "SELECT sum(NOT container), sum(container), sum(record), sum(consulted > 0), sum(used < ?) FROM pages WHERE scope=?"
        originals, consolidated, records, consulted, faded = (int(n or 0) for n in db.execute(query, (faded_before, scope)).fetchone())
        conversations = db.execute("SELECT count(DISTINCT conversation) FROM owners WHERE scope=? AND conversation != ''", (scope,)).fetchone()[0]
        forgotten = db.execute("SELECT count(*) FROM forgotten WHERE scope=?", (scope,)).fetchone()[0]
        kinds = {"originals": originals, "consolidated": consolidated, "conversations": conversations, "forgotten_turns": forgotten}
        return {**kinds, "records": records, "requests": self._clock(db, scope), "consulted": consulted, "faded": faded}

    def scopes(self, namespace: str) -> list[str]:
        """The names of ``namespace``'s scopes holding a page or a forgotten turn: a range of the scope index
        (a scope key is the namespace, ``/``, the name; ``0`` sorts just after ``/``)."""
        low, high = scope_key(namespace, ""), namespace + "0"
        query = "SELECT scope FROM pages WHERE scope >= ? AND scope < ? UNION SELECT scope FROM forgotten WHERE scope >= ? AND scope < ? ORDER BY scope"
        return [scope[len(low) :] for (scope,) in self._db().execute(query, (low, high, low, high))]

    def holds(self, scope: str) -> bool:
        """Whether the scope has a page: one index probe (asked on a request's path)."""
        return self._db().execute("SELECT 1 FROM pages WHERE scope=? LIMIT 1", (scope,)).fetchone() is not None

    def rows_after(self, scope: str, row: int) -> int:
        """The scope's pages written after ``row`` (what an index at ``row`` has yet to read)."""
        return int(self._db().execute("SELECT count(*) FROM pages WHERE row > ? AND scope=?", (row, scope)).fetchone()[0])

    def has_vectors(self, scope: str) -> bool:
        """Whether any of the scope's pages has a vector."""
        return self._db().execute("SELECT 1 FROM pages WHERE scope=? AND vector IS NOT NULL LIMIT 1", (scope,)).fetchone() is not None

    def forgotten(self, scope: str) -> set[str]:
        """The hashes of the scope's forgotten turns."""
        return {h for (h,) in self._db().execute("SELECT hash FROM forgotten WHERE scope=?", (scope,))}

    def watermark(self) -> tuple[int, int]:
        """The last row written and the last removal logged, in every scope."""
        db = self._db()
        row = db.execute("SELECT coalesce(max(row), 0) FROM pages").fetchone()[0]
        seq = db.execute("SELECT coalesce(max(seq), 0) FROM removed").fetchone()[0]
        return int(row), int(seq)

    def changes(self, scope: str, after_row: int, after_seq: int) -> tuple[Iterator[Stored], list[int], int]:
        """What an index saved at (``after_row``, ``after_seq``) lacks: the pages added since, the rows removed since, and the last seq."""
        db = self._db()
        removed = db.execute("SELECT seq, row FROM removed WHERE scope=? AND seq > ? ORDER BY seq", (scope, after_seq)).fetchall()
        last = removed[-1][0] if removed else after_seq
        query = f"SELECT {_READ} FROM pages WHERE scope=? AND row > ? ORDER BY row"
        added = (stored for values in self._db().execute(query, (scope, after_row)) if (stored := self._stored(scope, *values)) is not None)
        return added, [row for _, row in removed], int(last)

    def _stored(self, scope: str, row: int, body: bytes, conversation: str, recalls: int, vector: bytes | None, *use: int) -> Stored | None:
        """A row as read (``_READ``); None when its page does not open (sealed under another key)."""
        page = self.bodies.decode(scope, body)
        if page is None:
            return None
        record, shown, consulted, used = use
        return Stored(row, page, conversation, recalls, vector, bool(record), shown, consulted, used)


def _last_seq(db: sqlite3.Connection, scope: str) -> int:
    """The scope's last removal number."""
    return int(db.execute("SELECT coalesce(max(seq), 0) FROM removed WHERE scope=?", (scope,)).fetchone()[0])


class _transaction:
    """BEGIN IMMEDIATE … COMMIT, or ROLLBACK on an error: a write is whole or absent."""

    def __init__(self, db: sqlite3.Connection):
        """A write transaction on ``db``."""
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        """Begin, taking the write lock at once."""
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind: object, *_: object) -> None:
        """Commit, or roll back on an error."""
        self.db.execute("ROLLBACK" if kind is not None else "COMMIT")


def _chunks(items: Sequence[object]) -> Iterator[list[object]]:
    """``items`` in lists of at most ``_CHUNK`` (SQLite's bound on parameters)."""
    for start in range(0, len(items), _CHUNK):
        yield list(items[start : start + _CHUNK])


def _marks(chunk: Sequence[object]) -> str:
    """As many placeholders as ``chunk`` has items."""
    return ",".join("?" * len(chunk))
