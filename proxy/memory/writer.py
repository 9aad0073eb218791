"""The memory's writes in a fair order: one queue per tenant, served in turn, so one caller never stalls the others.

Memory has one writer thread (SQLite takes one writer at a time, and a
scope's index follows its writes in order). Its jobs once formed one queue in
the order they came: while one key imported many pages, another key's
``forget`` waited for all of them (``bench/own_api_limits.py``). Now each tenant (the caller's namespace, what a scope
key opens with) has its own queue, and the writer takes one job from each
tenant with work in turn: another tenant's job waits for at most one job of
each, and an import is written in batches (``proxy.memory.imports``), each a
job. A tenant's own jobs keep their order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

from ..storage.base import StoreUnavailable

__all__ = ["FairQueue", "Job", "patiently", "tenant_of"]

log = logging.getLogger("pcp.memory")


def tenant_of(scope: str) -> str:
    """Whose a scope is: the namespace its key opens with (``scope_key``); "" for the writer's own jobs."""
    return scope.partition("/")[0]


class Job(NamedTuple):
    run: Callable[[], Any]
    future: Future[Any]
    scope: str  # counted in ``Memory.pending`` while queued ("" : not counted)
    kind: str  # for the wait's histogram: write_back, ingest, recalled, forget, change
    queued: float  # time.monotonic() when it was queued
    patient: bool = True  # retried while the store is unavailable (a write-back); a request's own job is its 503 at once


class FairQueue:
    def __init__(self) -> None:
        """An empty queue."""
        self._queues: dict[str, deque[Job]] = {}
        self._turns: deque[str] = deque()  # tenants with jobs, in the order they are served
        self._ready = threading.Condition()
        self.outstanding = 0  # queued or running
        self.closed = False

    def put(self, tenant: str, job: Job) -> None:
        """``job`` queued for ``tenant``, served in turn with the other tenants'."""
        with self._ready:
            queue = self._queues.get(tenant)
            if queue is None:
                queue = self._queues[tenant] = deque()
            if not queue:
                self._turns.append(tenant)
            queue.append(job)
            self.outstanding += 1
            self._ready.notify_all()

    def take(self, timeout: float) -> Job | None:
        """The next job (the next tenant's first), or None once ``timeout`` passed with none, or it is closed and drained."""
        with self._ready:
            if not self._ready.wait_for(lambda: self._turns or self.closed, timeout):
                return None
            if not self._turns:
                return None
            tenant = self._turns.popleft()
            queue = self._queues[tenant]
            job = queue.popleft()
            if queue:
                self._turns.append(tenant)  # the back of the line: every other tenant goes first
            else:
                del self._queues[tenant]
            return job

    def done(self) -> None:
        """A job taken has finished."""
        with self._ready:
            self.outstanding -= 1
            self._ready.notify_all()

    def empty(self) -> bool:
        """Whether no tenant has a job queued."""
        return not self._turns

    def drained(self, timeout: float | None = None) -> bool:
        """Until no job is queued or running (tests, benchmarks, close)."""
        with self._ready:
            return self._ready.wait_for(lambda: self.outstanding == 0, timeout)

    def close(self) -> None:
        """Take no more jobs; the writer finishes those queued."""
        with self._ready:
            self.closed = True
            self._ready.notify_all()


# A write the store could not take (it is restarting, say) is tried again after these pauses, then given up.
STORE_RETRIES = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)


def patiently(job: Callable[[], Any]) -> Any:
    """``job()``, tried again while the store is unavailable: a write-back waits out a store's restart."""
    for pause in STORE_RETRIES:
        try:
            return job()
        except StoreUnavailable:
            log.warning("the store is unavailable: a memory write waits %.1f s", pause)
            time.sleep(pause)
    return job()
