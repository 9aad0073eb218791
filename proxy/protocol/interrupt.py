"""Work in a thread that stops once its request no longer wants it: the client left, or the time allowed is up.

A thread cannot be cancelled from outside, so the work checks in: the rules
call a checkpoint between their steps (``pcp_core.Checkpoint``), and this one
raises ``Stopped`` there once the awaiting task was cancelled or its deadline
passed. What the rules return is a new value, so stopping midway leaves
nothing half written.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Literal, TypeVar

__all__ = ["Interrupt", "Stopped"]

T = TypeVar("T")
Reason = Literal["client_left", "timeout"]


class Stopped(Exception):
    def __init__(self, reason: Reason):
        super().__init__(reason)
        self.reason: Reason = reason


class Interrupt:
    """A checkpoint for work handed to a thread: it raises ``Stopped`` once the work is no longer wanted."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        self.cancelled = threading.Event()

    def __call__(self) -> None:
        """Raise ``Stopped`` if the client has left or the deadline has passed (a checkpoint between steps of paging)."""
        if self.cancelled.is_set():
            raise Stopped("client_left")
        if time.monotonic() > self.deadline:
            raise Stopped("timeout")

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` in a thread; if this task is cancelled meanwhile (its client left), the work stops at its next checkpoint."""
        try:
            return await asyncio.to_thread(work)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
