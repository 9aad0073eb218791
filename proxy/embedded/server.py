"""The embedded model's process: llama-server on a free loopback port, started with the proxy and stopped with it.

Launched so that it protects itself and the machine:

* ``--parallel N --no-kv-unified``: N slots, so one long generation leaves the
  others free (``-c`` is split among them: each gets ``local_n_ctx``). Without
  ``--no-kv-unified`` a request pinned to a slot would not find its cached prompt.
* ``-n local_max_tokens``: a request that names no ``max_tokens`` stops there
  rather than filling its slot's context; a client's own ``max_tokens`` wins.
* ``--cache-ram``: the host-memory prompt cache is capped (llama.cpp's default is 8 GiB).
* ``-t``: half the cores, so the proxy keeps the rest (with every core, its
  threads spin-wait, and on busy cores a request took many times as long).
* ``--api-key``: a random key per start, which only the proxy sends, keeps other
  local processes off the port.

A client that leaves closes its connection, and llama-server stops that
slot's generation (``slots.py`` frees the proxy's side at once).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from .files import local_missing, model_alias, model_file, server_binary
from .slots import Slots

__all__ = ["CACHE_RAM_MB", "LocalModel", "LocalModelError"]

log = logging.getLogger("pcp.local_model")

CACHE_RAM_MB = 256  # the prompt cache kept in host memory, across slots
HEALTH_TIMEOUT = 1.0  # seconds /healthz waits for the server's own /health


class LocalModelError(RuntimeError):
    pass


def _free_port() -> int:
    """A port on the loopback interface that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def default_threads() -> int:
    """The threads the server generates with: half the machine's cores, at least one."""
    return max(1, (os.cpu_count() or 2) // 2)


class LocalModel:
    def __init__(
        self,
        data_dir: Path,
        *,
        n_ctx: int = 8192,
        slots: int = 2,
        max_tokens: int = 1024,
        threads: int = 0,
        queue_timeout: float = 30.0,
        server: str = "",
        model: str = "",
        startup_timeout: float = 120.0,
    ):
        self.n_ctx, self.max_tokens, self.threads = n_ctx, max_tokens, threads or default_threads()
        self.server, self.model = server, model
        self.alias = model_alias(model)
        self.startup_timeout = startup_timeout
        self.port = _free_port()
        self.key = secrets.token_urlsafe(24)
        self.slots = Slots(slots, queue_timeout, self.key)
        self.process: asyncio.subprocess.Process | None = None
        self.log_path = data_dir / "logs" / "local-model.log"

    @property
    def base_url(self) -> str:
        """The server's OpenAI-compatible base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        """The server's command line, or the error that says what is not installed."""
        server, model = server_binary(self.server), model_file(self.model)
        if server is None or model is None:
            raise LocalModelError(local_missing(self.server, self.model) or "the embedded model is not installed")
        return [
            str(server), "-m", str(model), "--alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port), "--api-key", self.key,
            "-c", str(self.n_ctx * self.slots.count), "--parallel", str(self.slots.count), "--no-kv-unified",
            "--cache-ram", str(CACHE_RAM_MB), "-t", str(self.threads), "-n", str(self.max_tokens),
            "--jinja",  # the chat template the GGUF carries
        ]  # fmt: skip

    async def start(self) -> str:
        """Start the server and wait until it is healthy; the model it serves."""
        command = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            self.process = await asyncio.create_subprocess_exec(*command, stdout=log_file, stderr=log_file)
        log.info("starting the local model %s on %s (log: %s)", self.alias, self.base_url, self.log_path)
        await self._wait_healthy()
        return self.base_url

    async def _wait_healthy(self) -> None:
        """Wait until the server answers its health check, or raise with its log's tail once it died or took too long."""
        deadline = time.monotonic() + self.startup_timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process is None or self.process.returncode is not None:
                    raise LocalModelError(f"the local model exited during start-up; see {self.log_path}:\n{self._log_tail()}")
                try:
                    if (await client.get(f"http://127.0.0.1:{self.port}/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        await self.stop()
        raise LocalModelError(f"the local model was not healthy after {self.startup_timeout:.0f}s; see {self.log_path}")

    async def health(self) -> dict[str, Any]:
        """What ``/healthz`` says of the model: ``ok``, ``busy`` (every slot generating, requests waiting) or ``down``."""
        health: dict[str, Any] = {"model": self.alias, "slots": self.slots.count, "generating": self.slots.busy, "waiting": self.slots.waiting}
        if self.process is None or self.process.returncode is not None:
            return {**health, "status": "down", "reason": f"the llama-server process exited ({self.process.returncode if self.process else 'not started'})"}
        try:
            async with httpx.AsyncClient(timeout=HEALTH_TIMEOUT) as client:
                answer = await client.get(f"http://127.0.0.1:{self.port}/health")
        except httpx.HTTPError as exc:
            return {**health, "status": "down", "reason": f"llama-server did not answer /health ({type(exc).__name__})"}
        if answer.status_code != 200:
            return {**health, "status": "down", "reason": f"llama-server's /health answered {answer.status_code}"}
        return {**health, "status": "busy" if self.slots.waiting else "ok"}

    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self.process.pid if self.process is not None else None

    def _log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` of the server's log, for an error that says why it failed."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self) -> None:
        """Stop the server: ask it to end, and kill it if it does not in time."""
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            process.kill()
            await process.wait()
