"""Page summaries written by the upstream model in the background (``PCP_SUMMARIES=llm``).

A request never waits for them. A page is built with its extractive summary,
which stands in until the model's lands; the next request that pages the
conversation picks it up, and its session keeps it. Summaries are cached in
the store by a hash of the text summarised, so no text is summarised twice — not by
a follow-up, not by another conversation, not after a restart. Calls carry
``x-pcp-role: consolidator`` and run one at a time, in the background.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple, Protocol

from pcp_core import ConsolidatedPage, Page, PagedHistory, fold_system, model_summary, short_hash, summary_prompt

from .. import headers as pcp
from ..apis.chat import CHAT, check
from ..metrics import Metrics
from ..storage.base import Store
from ..storage.embedded import EmbeddedStore
from ..storage.sealing import Sealer
from ..upstream import Upstream

__all__ = ["SummaryWriter", "closed_pages"]

log = logging.getLogger("pcp.proxy")

SUMMARY_MAX_TOKENS = 120
SUMMARY_VERSION = "v1"  # part of the cache key: a new prompt means new summaries


class Job(NamedTuple):
    page_id: str
    key: str  # the hash of the text summarised
    text: str
    model: str
    headers: Mapping[str, str]


class Summaries(Protocol):
    """What a request asks of the summaries: those landed, and a model summary of its closed pages."""

    @property
    def landed(self) -> Mapping[str, str]:
        """Model summaries written so far, by page id."""

    async def submit(self, pages: PagedHistory, model: str, headers: Mapping[str, str]) -> None:
        """Ask for model summaries of the closed pages that have none."""


class NoSummaryWriter:
    """Where summaries are extractive: no page waits for a model's summary."""

    landed: Mapping[str, str] = MappingProxyType({})

    async def submit(self, pages: PagedHistory, model: str, headers: Mapping[str, str]) -> None:
        """Nothing to ask for."""


class SummaryWriter:
    """Model summaries of closed pages, written in the background by the upstream model."""

    def __init__(self, store: Store | Path, upstream: Upstream, metrics: Metrics, max_chars: int, sealer: Sealer | None = None, *, fold_system: bool = False):
        self.store: Store = EmbeddedStore(store) if isinstance(store, Path) else store  # by the hash of the text: shared by every caller
        self.sealer = sealer or Sealer()  # summaries are the conversation's text, retold
        self.upstream = upstream
        self.metrics = metrics
        self.max_chars = max_chars
        self.fold_system = fold_system  # the upstream ignores system messages: the instructions open the user's
        self.landed: dict[str, str] = {}  # page id → the model's summary
        self.queued: set[str] = set()
        self.failed: set[str] = set()  # not asked again by this process: no retry storms
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start writing, in a task of the event loop."""
        self.task = asyncio.create_task(self._run(), name="pcp-summary-writer")

    async def stop(self) -> None:
        """Stop writing, and close the store."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await asyncio.to_thread(self.store.close)

    # -- what requests call ------------------------------------------------------------
    async def submit(self, pages: PagedHistory, model: str, headers: Mapping[str, str]) -> None:
        """Ask for a model summary of every closed page that has none (and has not failed to get one)."""
        wanted = [p for p in closed_pages(pages) if p.id not in self.landed and p.id not in self.queued and p.id not in self.failed]
        if not wanted:
            return
        summaries = {p.id: p.summary for p in (*pages.leaves, *pages.containers)}
        jobs = [self._job(p, summaries, model, headers) for p in wanted]
        cached = await asyncio.to_thread(lambda: {job.key: self._cached(job.key) for job in jobs})
        for job in jobs:
            summary = cached[job.key]
            if summary is not None:
                self.landed[job.page_id] = summary
                self.metrics.inc("pcp_summaries_total", state="cached")
            else:
                self.queued.add(job.page_id)
                self.queue.put_nowait(job)
                self.metrics.inc("pcp_summaries_total", state="queued")

    def _cached(self, key: str) -> str | None:
        """The summary the store holds for ``key`` (a text's hash), if any."""
        stored = self.store.get((key,))  # (stored as text by an earlier version: read as its bytes)
        opened = self.sealer.open(stored, key) if stored is not None else None
        return opened.decode() if opened is not None else None

    # -- the background worker -----------------------------------------------------------
    def _job(self, page: Page, summaries: Mapping[str, str], model: str, headers: Mapping[str, str]) -> Job:
        # A container is the consensus of its children: summarise what they say.
        """The summary ``page`` asks for: of its text, or a container's of its children's summaries."""
        text = "\n".join(summaries[c] for c in page.source_ids) if isinstance(page, ConsolidatedPage) else page.content
        return Job(page.id, short_hash(SUMMARY_VERSION, text, length=24), text, model, headers)

    async def _run(self) -> None:
        """Write summaries as they are asked for, one at a time, until stopped."""
        while True:
            job = await self.queue.get()
            state = "failed"
            try:
                summary = await self._ask(job)
                if summary is not None:
                    await asyncio.to_thread(self.store.set_many, {(job.key,): self.sealer.seal(summary.encode(), job.key)})
                    self.landed[job.page_id] = summary
                    state = "landed"
                else:
                    self.failed.add(job.page_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a summary is an improvement, never a failure of anyone's request
                self.failed.add(job.page_id)
                log.warning("summary writer: no summary for page %s: %s", job.page_id, exc)
            finally:
                self.metrics.inc("pcp_summaries_total", state=state)
                self.queued.discard(job.page_id)
                self.queue.task_done()

    async def _ask(self, job: Job) -> str | None:
        """The upstream model's summary of the job's text; None when it gives none."""
        self.metrics.inc("pcp_upstream_calls_total", role="consolidator")
        messages = summary_prompt(job.text)
        body = {"model": job.model, "messages": fold_system(messages) if self.fold_system else messages, "max_tokens": SUMMARY_MAX_TOKENS, "temperature": 0}
        headers = {**job.headers, pcp.ROLE: "consolidator", "content-type": "application/json"}
        started = time.perf_counter()
        data, _ = await self.upstream.complete(CHAT.path, json.dumps(body).encode(), headers, check)
        self.metrics.observe("pcp_upstream_seconds", time.perf_counter() - started, role="consolidator")
        return model_summary(data["choices"][0]["message"].get("content") or "", self.max_chars)


def closed_pages(pages: PagedHistory) -> list[Page]:
    """The pages that will not change again: not the last leaf, nor a container above it.

    The last page is reopened by the next follow-up, so its summary would be wasted.
    """
    if not pages.leaves:
        return []
    open_ids = {pages.leaves[-1].id}
    for container in pages.containers:  # bottom up, so a parent sees its child's mark
        if open_ids.intersection(container.source_ids):
            open_ids.add(container.id)
    every: list[Page] = [*pages.leaves, *pages.containers]
    return [p for p in every if p.id not in open_ids]
