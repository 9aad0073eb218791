"""``python -m tests.proxy.killed_commits DIR``: a session's follow-up committed to the embedded store, killed at every step.

The driver keeps a session (version 1) in a store under ``DIR``, then, for
each step ``n`` of the follow-up's commit (version 2), copies that store and
forks a child that commits the follow-up to the copy and SIGKILLs itself just
before its ``n``-th step: an SQL statement (SQLite's trace, so ``COMMIT``
too), a value written to a file, a file removed. The driver reopens each copy
and prints one JSON line per step: whether the child was killed, and what the
store holds of the session (``old``, ``new``, ``none`` or ``other``). The last
line is a step past the commit's last, which the child lives through.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import sys
from pathlib import Path

from pcp_core import Conversation, Session
from proxy.storage.sessions import SessionStore
from proxy.testing.upstream import paged_session

NAMESPACE = "ns"
WORDS = "lamp river orchard invoice ledger harbour violin granite meadow lantern copper thistle".split()


def messages(n: int, start: int = 0) -> list[dict]:
    """Turns of ~1.5 kB each: a session's parts of pages are over diskcache's 32 kB, so they are files."""
    said = []
    for i in range(start, start + n):
        text = " ".join(f"{WORDS[(i * 7 + j) % len(WORDS)]}-{i}-{j}" for j in range(120))
        said.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: {text}"})
    return said


def count(text: str) -> int:
    return len(text) // 4 + 1


def held(session: Session | None) -> tuple | None:
    return None if session is None else (session.id, session.chain, session.seen_at, session.pages)


def commit_and_die(directory: Path, kill_at: int, follow_up: Session) -> None:
    """In the forked child: commit ``follow_up`` on the version held, SIGKILLed just before step ``kill_at``."""
    steps = 0

    def step(*_: object) -> None:
        nonlocal steps
        steps += 1
        if steps == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    store = SessionStore(directory)
    base = store.resolve(NAMESPACE, Conversation(head=[], history=[], query=None), pinned="s-1").version
    connect, remove = sqlite3.connect, os.remove

    def traced(*args: object, **kwargs: object) -> sqlite3.Connection:
        connection = connect(*args, **kwargs)
        connection.set_trace_callback(step)  # called as each statement starts
        return connection

    def removed(path: str, *args: object, **kwargs: object) -> None:
        step()
        remove(path, *args, **kwargs)

    disk = store.store.cache.disk
    stored = disk.store

    def written(*args: object, **kwargs: object) -> object:
        step()
        return stored(*args, **kwargs)

    sqlite3.connect, os.remove, disk.store = traced, removed, written
    store.save(NAMESPACE, follow_up, new_links=len(follow_up.chain) - 40, base=base).kept.result()  # on the writer's thread: its own connection
    print(json.dumps({"steps": steps}), flush=True)
    os._exit(0)


def main(argv: list[str]) -> None:
    root = Path(argv[0])
    first = paged_session(messages(40), count)
    follow_up = paged_session(messages(44), count, known=first)
    base = root / "base"
    store = SessionStore(base)
    store.save(NAMESPACE, first, new_links=40).kept.result()
    store.close()
    files = _files(base)

    n, total = 0, None
    while total is None or n <= total:
        n += 1
        copy = root / f"kill-{n}"
        shutil.copytree(base, copy)
        child = os.fork()
        if child == 0:
            try:
                commit_and_die(copy, n, follow_up)
            finally:
                os._exit(1)
        _, status = os.waitpid(child, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        line: dict[str, object] = {"step": n, "killed": killed}
        if not killed:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child that commits failed at step {n}"
            total = n - 1
            now = _files(copy)  # the values held in files that the follow-up replaced
            line["replaced_files"] = sum(1 for key, name in files.items() if now.get(key) != name)
            on_disk = {str(path.relative_to(copy)) for path in copy.rglob("*.val")}
            line["unnamed_files"] = len(on_disk - set(now.values()))  # collected after the commit
        reader = SessionStore(copy)
        found = held(reader.read(NAMESPACE, "s-1"))
        reader.close()
        line["found"] = "old" if found == held(first) else "new" if found == held(follow_up) else "none" if found is None else "other"
        print(json.dumps(line), flush=True)
        shutil.rmtree(copy)


def _files(directory: Path) -> dict[str, str]:
    """The keys whose values are files in diskcache, with their files' names."""
    with sqlite3.connect(directory / "cache.db") as db:
        return dict(db.execute("SELECT key, filename FROM Cache WHERE filename IS NOT NULL").fetchall())


if __name__ == "__main__":
    main(sys.argv[1:])
