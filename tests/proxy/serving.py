"""`pcp-proxy serve` in a process of its own, as the tests that need one start it."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(process: subprocess.Popen, port: int, timeout: float = 30) -> None:
    """Until the proxy on ``port`` answers /healthz; fails if ``process`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert process.poll() is None, "pcp-proxy exited during start-up"
        assert time.monotonic() < deadline, "pcp-proxy did not become healthy"
        time.sleep(0.1)
