"""``pcp-proxy sessions list | show ID``: the sessions in the data dir, read as the proxy stores them.

For the operator, who has the data dir: every namespace is listed (by the
first characters of its hash; no key can be read back from it). The store may
be in use by a running proxy: SQLite lets both read it. Walking a large store
shows a progress bar on a terminal.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from pcp_core import Session

from ..inspector.data import TreePage, page_tree, session_summary
from ..settings import Settings
from ..storage.sealing import Sealer, data_key
from ..storage.sessions import SessionStore
from ..tokenizer import Tokenizer

__all__ = ["Progress", "list_sessions", "show_session"]

NAMESPACE_SHOWN = 12  # hex characters of a namespace shown: enough to tell them apart, and to pass to --namespace


class Progress:
    """A bar on ``stream`` for a walk of ``total`` items, redrawn at most ten times a second (``live``: a terminal)."""

    def __init__(self, what: str, total: int, stream: IO[str], live: bool | None = None, width: int = 30):
        """A progress bar for ``total`` items on ``stream``, drawn only on a terminal unless ``live`` says."""
        self.what, self.total, self.stream, self.width = what, total, stream, width
        self.live = stream.isatty() if live is None else live
        self.done, self.drawn, self.started = 0, 0.0, time.monotonic()

    def step(self, n: int = 1) -> None:
        """``n`` more done, the bar drawn again at most ten times a second."""
        self.done += n
        now = time.monotonic()
        if self.live and (now - self.drawn >= 0.1 or self.done >= self.total):
            self.drawn = now
            filled = self.width * self.done // max(self.total, 1)
            self.stream.write(f"\r{self.what} [{'#' * filled}{'.' * (self.width - filled)}] {self.done:,}/{self.total:,}")
            self.stream.flush()

    def close(self) -> None:
        """The bar replaced by how many were done, and in how long."""
        if self.live:
            self.stream.write(f"\r{self.what}: {self.done:,} in {time.monotonic() - self.started:.1f} s{' ' * self.width}\n")
            self.stream.flush()


def _store(settings: Settings) -> SessionStore:
    """The session store the settings name."""
    from ..storage import Stores

    stores = Stores(settings.store, settings.data_path)
    return SessionStore(stores.area("sessions"), sealer=Sealer(data_key(settings.data_key) if settings.data_key else None))


def _walk(store: SessionStore, keys: list[tuple[str, str]], err: IO[str], live: bool | None) -> list[tuple[str, Session]]:
    """The sessions at ``keys``, read with a progress bar; those that no longer read back are left out."""
    progress = Progress("reading sessions", len(keys), err, live)
    found = []
    for namespace, session_id in keys:
        session = store.read(namespace, session_id)
        if session is not None:
            found.append((namespace, session))
        progress.step()
    progress.close()
    return found


def list_sessions(settings: Settings, namespace: str = "", out: IO[str] = sys.stdout, err: IO[str] = sys.stderr, live: bool | None = None) -> int:
    """``pcp-proxy sessions list``: the stored sessions, one a line; the exit status."""
    store = _store(settings)
    try:
        keys = [key for key in store.stored() if key[0].startswith(namespace)]
        found = _walk(store, keys, err, live)
    finally:
        store.close()
    rows = sorted((session_summary(session) | {"namespace": ns} for ns, session in found), key=lambda s: s["last_seen"], reverse=True)
    out.write(f"{'namespace':<{NAMESPACE_SHOWN}}  {'session':<24} {'messages':>8} {'pages':>7}  from              to                last seen\n")
    for s in rows:
        out.write(
            f"{s['namespace'][:NAMESPACE_SHOWN]:<{NAMESPACE_SHOWN}}  {s['id']:<24} {s['messages']:>8,} {s['originals'] + s['consolidated']:>7,}  {_when(s['first']):<17} {_when(s['last']):<17} {_when(s['last_seen'])}\n"
        )
    out.write(f"{len(rows):,} session(s) in {settings.data_path / 'sessions'}\n")
    return 0


def show_session(
    settings: Settings, session_id: str, namespace: str = "", out: IO[str] = sys.stdout, err: IO[str] = sys.stderr, live: bool | None = None
) -> int:
    """``pcp-proxy sessions show``: one stored session; the exit status."""
    store = _store(settings)
    try:
        keys = [key for key in store.stored() if key[1] == session_id and key[0].startswith(namespace)]
        found = _walk(store, keys, err, live)
    finally:
        store.close()
    if not found:
        err.write(f"pcp-proxy: no session {session_id!r} in {settings.data_path / 'sessions'}\n")
        return 1
    if len(found) > 1:
        err.write(
            f"pcp-proxy: {len(found)} namespaces hold a session {session_id!r}; name one with --namespace: {', '.join(ns[:NAMESPACE_SHOWN] for ns, _ in found)}\n"
        )
        return 1
    ns, session = found[0]
    s = session_summary(session)
    out.write(f"session {session.id}  namespace {ns[:NAMESPACE_SHOWN]}\n")
    out.write(
        f"{s['messages']:,} messages, {s['originals']:,} Original and {s['consolidated']:,} Consolidated pages, {s['blocks']:,} File blocks; from {_when(s['first'])} to {_when(s['last'])}\n\n"
    )
    roots, pages = page_tree(session, Tokenizer(settings.tokenizer).count)
    for line in tree_lines(roots, {page.id: page for page in pages}):
        out.write(line + "\n")
    return 0


def tree_lines(roots: list[str], pages: dict[str, TreePage], summary_chars: int = 70) -> list[str]:
    """The page tree drawn with box characters, a page a line: type, id, date, size, topic, the start of its summary."""
    lines: list[str] = []
    stack = [(root, "", i == len(roots) - 1) for i, root in reversed(list(enumerate(roots)))]
    while stack:
        page_id, indent, last = stack.pop()
        page = pages[page_id]
        size = f"{len(page.children)} pages, " if page.children else ""
        topic = f" · topic {page.topic}" if page.topic else ""
        gist = page.summary.replace("\n", " ")
        gist = gist if len(gist) <= summary_chars else gist[: summary_chars - 1] + "…"
        lines.append(f"{indent}{'└─' if last else '├─'} {page.type[:4]} {page.id} · {_when(page.timestamp)} · {size}{page.tokens:,} tokens{topic} · {gist}")
        below = indent + ("   " if last else "│  ")
        stack.extend((kid, below, i == len(page.children) - 1) for i, kid in reversed(list(enumerate(page.children))))
    return lines


def _when(stamp: str) -> str:
    """An ISO time to the minute, as the listing shows it."""
    return stamp.replace("T", " ")[:16]
