"""Memory across conversations (P-Mem): the host's side.

``Memory`` owns the store, each scope's indexes and one writer thread. On a
request's path it only answers (``has_pages``, ``recall``, ``load``); what
a request leaves (``write_back``, ``ingest``) is queued for the writer, which
pages it when needed, writes it in one transaction, keeps the indexes in
step, and — when the queue is empty — runs the Memory Consolidator over the
scopes written to and saves the indexes now and then. The rules are
``pcp_core.memory``'s; this module only does their I/O.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from datetime import datetime
from pathlib import Path
from typing import Any

from pcp_core import Conversation, Facts, LoadPages, OriginalPage, Page, Policy, Session, prepare, short_hash
from pcp_core.memory import (
    Candidate,
    ConsolidatorPolicy,
    MemoryIntake,
    MemoryPolicy,
    MemoryUse,
    Root,
    asks,
    conversation_pages,
    horizontal_merges,
    index_weights,
    memory_intent,
    memory_pages,
    selection,
)
from pcp_core.pages.logical import iso_timestamp
from pcp_core.ranking.bm25 import stems
from pcp_core.ranking.router import Intent
from pcp_core.text.terms import TermStats
from pcp_core.text.tokens import CountText

from ..resident import close_least_used, indexes_bytes, used_last
from ..storage.base import StoreUnavailable
from .encoding import cosine, encode_pages, encode_query
from .forgetting import forget_ids, forget_query
from .intake import judged
from .scope_cores import ScopeCores
from .search import ScopeIndex
from .store import MemoryStore, Written
from .writer import FairQueue, Job, patiently, tenant_of

__all__ = ["Memory"]

log = logging.getLogger("pcp.memory")

AskModel = Callable[[list[dict[str, str]]], Awaitable[str | None]]
_PERIODS = 12  # periods an intent names that are looked up (the latest first)


class Memory:
    def __init__(
        self,
        directory: Path,
        store: MemoryStore,
        *,
        policy: Policy,
        count: CountText,
        memory: MemoryPolicy = MemoryPolicy(),
        intake: MemoryIntake = MemoryIntake(),
        embedder: Any = None,
        sessions: Any = None,
        metrics: Any = None,
        shared: bool = False,
        cores: ScopeCores | None = None,
        max_index_bytes: int = 0,
    ):
        """Memory over ``store``, its indexes under ``directory``; its writer thread started."""
        self.directory, self.store, self.policy, self.count = directory, store, policy, count
        self.max_index_bytes = max_index_bytes  # what open indexes may hold (``proxy.resident``; 0: unbounded)
        # Other processes write the store too: what this one knows of a scope is read again, and its indexes catch up.
        self.shared = shared
        self.memory, self.intake, self.embedder, self.sessions, self.metrics = memory, intake, embedder, sessions, metrics
        self.cores = cores  # Hybrid mode's core blocks, by scope: dropped with it
        self.indexes: dict[str, ScopeIndex] = {}
        self.known: dict[str, bool] = {}  # scope -> holds pages (what the Sentry asks on every request)
        self.pending: Counter[str] = Counter()  # write-backs queued, by scope
        self.fresh: dict[str, list[Root]] = {}  # roots written since the consolidator last ran, by scope
        self._forgotten: dict[str, set[str]] = {}
        self._open_lock = threading.Lock()  # a write and its index update are one step for an index being opened
        self._jobs = FairQueue()  # by tenant, served in turn
        if metrics is not None:
            metrics.gauge("pcp_memory_pending", lambda: self._jobs.outstanding)
        self._writer = threading.Thread(target=self._run, name="pcp-memory", daemon=True)
        self._writer.start()

    # -- on a request's path ---------------------------------------------------------------
    def has_pages(self, scope: str) -> bool:
        """Whether the scope holds any page (asked of the store again while it held none, or when shared)."""
        if not self.known.get(scope) and (self.shared or scope not in self.known):  # another process may write its first page
            self.known[scope] = self.store.holds(scope)
        return self.known[scope]

    async def recall(self, scope: str, conversation: Conversation, now_ns: int, ask_model: AskModel | None = None) -> list[Page]:
        """The pages the Memory Router gives a request: broad match in a thread, precision selection by the rules
        (and the router model, through ``ask_model``)."""
        now = datetime.fromtimestamp(now_ns / 1e9).replace(tzinfo=None) if now_ns else None
        intent = memory_intent(conversation, self.policy, now, self.count)
        candidates = await asyncio.to_thread(self.broad_match, scope, intent)
        rules = selection(intent, candidates, now, self.count, self.memory)
        reply: Any = None
        try:
            while True:
                effect = rules.send(reply)
                if isinstance(effect, LoadPages):
                    reply = await self.load(scope, effect.ids)
                else:
                    reply = await ask_model(effect.messages) if ask_model is not None else None
        except StopIteration as done:
            chosen: list[Page] = done.value
        self._inc("pcp_memory_recalled_total", len(chosen))  # each page's own count goes with the request's write-back (its use)
        return chosen

    def broad_match(self, scope: str, intent: Intent, records: bool = False) -> list[Candidate]:
        """The first stage: keyword and vector matches, and the pages written in the periods the intent names (``records``: records too, the API's)."""
        index = self.index(scope)
        if self.shared:
            index.catch_up(self.store, scope)
        vector = encode_query(self.embedder, intent.text)
        found = index.broad_match(index_weights(intent), vector, self.memory.candidates)
        if records:
            found = {**index.records_match(index_weights(intent), self.memory.candidates), **found}
        per_period = max(self.memory.candidates // max(len(intent.periods), 1), 20)
        for period in sorted(intent.periods, key=lambda p: p.start, reverse=True)[:_PERIODS]:
            for row in self.store.in_period(scope, period.start.isoformat(), period.end.isoformat(), per_period):
                found.setdefault(row, (0.0, float("nan")))
        stored = [s for s in self.store.stored(scope, list(found)) if records or not s.record]  # a period's pages may be records
        parents = self.store.parents(scope, [s.page.id for s in stored])
        clock = self.store.clock(scope)
        return [
            Candidate(
                s.page, found[s.row][0], cosine(vector, s.vector), s.recalls, s.conversation, next(iter(parents.get(s.page.id, [])), ""),
                max(clock - s.used, 0), s.consulted, s.record,
            )
            for s in stored
        ]  # fmt: skip

    async def load(self, scope: str, ids: Sequence[str]) -> list[Page]:
        """A page fault: the pages of ``ids`` the scope holds."""
        return await asyncio.to_thread(self.store.pages, scope, list(ids))

    def write_back(self, scope: str, session: Session, conversation: Conversation, now_ns: int, use: MemoryUse | None = None) -> Future[Any]:
        """Keep a protocol-mode request's messages (its session holds the history paged), and what it did with the pages it was given."""

        def job() -> None:
            """Write the session back into the scope, and what the request used of it."""
            self._write_back(scope, session, conversation, now_ns)
            if use is not None and use.given:
                self.store.metabolise(scope, use)

        return self._submit(scope, job, kind="write_back")

    def ingest(self, scope: str, namespace: str, conversation: Conversation, now_ns: int, pinned: str | None = None) -> Future[Any]:
        """Keep a forwarded request's messages: paged as a session in the background (and kept as one), then written back."""
        return self._submit(scope, lambda: self._ingest(scope, namespace, conversation, now_ns, pinned), kind="ingest")

    def wait(self) -> None:
        """Until every write queued so far is stored (tests, benchmarks)."""
        self._jobs.drained()

    # -- the writer thread ---------------------------------------------------------------------
    def _submit(self, scope: str, job: Callable[[], Any], counted: bool = True, kind: str = "change", patient: bool = True) -> Future[Any]:
        """Queue ``job`` on the writer, in its tenant's turn (``proxy.memory.writer``); ``counted``: a write-back, in ``pending``;
        ``patient``: tried again while the store is unavailable (no request waits for it)."""
        future: Future[Any] = Future()
        if counted:
            self.pending[scope] += 1
        self._jobs.put(tenant_of(scope), Job(job, future, scope if counted else "", kind, time.monotonic(), patient))
        return future

    def _run(self) -> None:
        """The writer thread: jobs in turn, and tidying when idle, until closed and drained."""
        while True:
            job = self._jobs.take(timeout=1.0)
            if job is None:
                if self._jobs.closed and self._jobs.empty():
                    self._idle(force=True)
                    return
                self._idle()
                continue
            if self.metrics is not None:
                self.metrics.observe("pcp_memory_write_wait_seconds", time.monotonic() - job.queued, kind=job.kind)
            outcome: tuple[bool, Any]
            try:
                outcome = (True, patiently(job.run) if job.patient else job.run())
            except StoreUnavailable as error:  # its request is a 503; a write-back waited out the retries
                log.warning("a memory write (%s) failed: %s", job.kind, error)
                outcome = (False, error)
            except BaseException as error:  # a failed write-back loses that write, never the writer
                log.exception("memory write failed")
                outcome = (False, error)
            if job.scope:  # counted out before its request hears of it: an answer and the counts agree
                self.pending[job.scope] -= 1
            self._jobs.done()
            job.future.set_result(outcome[1]) if outcome[0] else job.future.set_exception(outcome[1])
            if self._jobs.empty():
                self._idle()

    def _idle(self, force: bool = False) -> None:
        """The queue is empty: consolidate the scopes written to, train an outgrown vector index, save what is due."""
        try:
            self._tidy(force)
        except StoreUnavailable:
            pass  # again once the store is back

    def _tidy(self, force: bool) -> None:
        """Consolidate the scopes written to, and save the indexes that changed."""
        for scope in list(self.fresh):
            try:
                self._consolidate(scope)
            except Exception:
                log.exception("memory consolidation of a scope failed")
        row, seq = self.store.watermark()
        for scope, index in list(self.indexes.items()):
            try:
                index.retrain(self.store, scope)
                index.save_if_due(*((index.row, index.seq) if self.shared else (row, seq)), force)
            except Exception:
                log.exception("saving a memory index failed")

    def _ingest(self, scope: str, namespace: str, conversation: Conversation, now_ns: int, pinned: str | None) -> None:
        """A conversation sent with a scope, paged as a session is, so memory can write it back."""
        if self.sessions is None or conversation.query is None:
            return
        resolution = self.sessions.resolve(namespace, conversation, pinned)
        prepared = prepare(conversation, resolution, self.policy, Facts(namespace=namespace, now_ns=now_ns), self.count)
        base = resolution.version if resolution.found is not None and resolution.found.id == prepared.session.id else ""
        self.sessions.save(namespace, prepared.session, prepared.new_links, conversation.chained, base=base, pinned=pinned is not None)
        self._write_back(scope, prepared.session, conversation, now_ns)

    def _write_back(self, scope: str, session: Session, conversation: Conversation, now_ns: int) -> None:
        """A session's new pages written into the scope, each judged a page or a record."""
        history = conversation_pages(session, conversation, iso_timestamp(now_ns / 1e9), self.count, self.policy.paging)
        index = self.index(scope)
        if self.shared:  # judged against what every process wrote
            index.catch_up(self.store, scope)
        kept = judged(self.store, index, scope, session.id, memory_pages(history, self.forgotten(scope), self.policy.paging), self.intake)
        pages, records = kept.pages, kept.records
        written = self._write(scope, lambda vectors: self.store.write(scope, session.id, pages, vectors, records), pages, records=records)
        below = {child for page in pages for child in getattr(page, "source_ids", ())}
        fresh_ids = {s.page.id for s in written.added}
        roots = [Root(page, session.id) for page in pages if page.id not in below and page.id in fresh_ids and page.id not in records and not asks(page)]
        if roots:  # consolidated in the same step: once ``pending`` is 0, the containers over them are there too
            self.fresh.setdefault(scope, []).extend(roots)
            self._consolidate(scope)

    def _write(
        self,
        scope: str,
        write: Callable[[dict[str, bytes]], Written],
        pages: Sequence[Page],
        vectors: dict[str, bytes] | None = None,
        records: frozenset[str] = frozenset(),
    ) -> Written:
        """One write: the new pages' vectors first (outside the transaction; ``vectors``: encoded already; a record ranks
        by none), then the write and its index update, as one step."""
        if vectors is None:
            vectors = self.page_vectors(scope, pages, records)
        with self._open_lock:
            written = write(vectors)
            index = self.indexes.get(scope)
            if index is not None:  # (shared: others' writes may have come between, in row order: read them all)
                index.catch_up(self.store, scope) if self.shared else index.apply(written)
        if written.added:
            self.known[scope] = True
        self._inc("pcp_memory_pages_written_total", len(written.added))
        return written

    def _consolidate(self, scope: str) -> None:
        """Containers over the scope's newly written pages."""
        fresh = self.fresh.pop(scope, [])
        held = {p.id for p in self.store.pages(scope, [r.page.id for r in fresh])}
        parents = self.store.parents(scope, [r.page.id for r in fresh])
        fresh = [r for r in fresh if r.page.id in held and r.page.id not in parents]
        if not fresh:
            return
        index = self.index(scope)
        rows: dict[int, None] = {}
        for root in fresh:
            rows.update(dict.fromkeys(index.broad_match({k: 1.0 for k in stems(root.page.keywords)}, None, 8)))
        seen = {r.page.id for r in fresh}
        known = [s for s in self.store.stored(scope, list(rows)) if s.page.id not in seen]
        rooted = self.store.parents(scope, [s.page.id for s in known])
        roots = [Root(s.page, s.conversation) for s in known if s.page.id not in rooted and not asks(s.page)]
        stats = TermStats([r.page.content or r.page.summary for r in (*fresh, *roots)])
        merged = horizontal_merges(fresh, roots, stats, ConsolidatorPolicy(paging=self.policy.paging))
        if merged:
            self._write(scope, lambda vectors: self.store.add(scope, merged, vectors), merged)
            self._inc("pcp_memory_merged_total", len(merged))

    # -- indexes, vectors, forgetting ----------------------------------------------------------
    def index(self, scope: str) -> ScopeIndex:
        """The scope's indexes, opened (and caught up with the store) once."""
        index = self.indexes.get(scope)
        if index is None:
            with self._open_lock:
                index = self.indexes.get(scope)
                if index is None:
                    index = self.indexes[scope] = ScopeIndex.open(self.store, scope, self._index_directory(scope))
                    close_least_used(self.indexes, self.max_index_bytes)
        elif self.max_index_bytes:
            used_last(self.indexes, scope, self._open_lock)
        return index

    @property
    def resident_bytes(self) -> int:
        """What the open indexes hold in memory."""
        return indexes_bytes(self.indexes)

    def indexing(self, scope: str) -> int:
        """Pages the store holds that this process's indexes have not read yet: another process wrote them (a shared
        store); the scope's next search reads them first. (This process's own write-backs are indexed, with the
        containers over them, before ``pending`` counts them out.)"""
        index = self.indexes.get(scope)
        return self.store.rows_after(scope, index.row) if index is not None else 0

    def _index_directory(self, scope: str) -> Path:
        """Where the scope's indexes are kept."""
        return self.directory / "index" / short_hash(scope, length=24)

    def forgotten(self, scope: str) -> set[str]:
        """The hashes of the scope's forgotten turns (read again when shared)."""
        if scope not in self._forgotten or self.shared:  # another process may have forgotten turns since
            self._forgotten[scope] = self.store.forgotten(scope)
        return self._forgotten[scope]

    def forget(self, scope: str, ids: Sequence[str] = (), query: str = "") -> Future[list[str]]:
        """Remove pages for good (by ids, or those holding every term of ``query``), on the writer thread."""

        def job() -> list[str]:
            """Forget what the query or the ids name; the ids of the pages removed or rewritten."""
            plan = forget_query(self.store, scope, query, self.policy.paging) if query else forget_ids(self.store, scope, list(ids), self.policy.paging)
            self._write(scope, lambda _: self.store.remove(scope, plan.removed, plan.rewritten, plan.hashes), [])
            self.forgotten(scope).update(plan.hashes)
            self.known.pop(scope, None)
            return [*plan.removed, *(p.id for p in plan.rewritten if isinstance(p, OriginalPage))]

        return self._submit(scope, job, counted=False, kind="forget", patient=False)

    def run(self, scope: str, job: Callable[[], Any]) -> Future[Any]:
        """Any other change to a scope (an import's batch, a drop), on the writer thread, for a request that waits for it."""
        return self._submit(scope, job, counted=False, patient=False)

    def drop(self, scope: str) -> int:
        """Everything the scope holds, its indexes too; call on the writer thread (``run``)."""
        with self._open_lock:
            removed = self.store.drop(scope)
            self.indexes.pop(scope, None)
            shutil.rmtree(self._index_directory(scope), ignore_errors=True)
        if self.cores is not None:
            self.cores.forget(scope)
        for held in (self.known, self._forgotten, self.fresh):
            held.pop(scope, None)
        return removed

    def write_pages(
        self, scope: str, pages: Sequence[Page], owner: str, vectors: dict[str, bytes] | None = None, records: frozenset[str] = frozenset()
    ) -> Written:
        """Pages no conversation writes (an import; ``records``: those export marked); call on the writer thread (``run``).
        ``vectors``: encoded beforehand (``page_vectors``, in a thread of the request's), so the writer that every caller
        shares is held for the write alone."""
        return self._write(scope, lambda found: self.store.add(scope, pages, found, owner, records), pages, vectors, records)

    def page_vectors(self, scope: str, pages: Sequence[Page], records: frozenset[str] = frozenset()) -> dict[str, bytes]:
        """The vectors of those of ``pages`` the scope does not hold yet, records aside (blocking: the encoder's)."""
        new = self.store.missing(scope, [p.id for p in pages])
        return encode_pages(self.embedder, [p for p in pages if p.id in new and p.id not in records])

    def _inc(self, name: str, value: int = 1) -> None:
        """Add ``value`` to the metric ``name``, when there are metrics."""
        if self.metrics is not None and value:
            self.metrics.inc(name, value)

    def close(self) -> None:
        """Finish the queued writes, then close the store."""
        self._jobs.close()  # the writer finishes what is queued, then stops
        self._writer.join()
        self.store.close()
        if self.cores is not None:
            self.cores.close()
