"""`pcp-proxy serve` in a process of its own, as the tests that need one start it."""

from __future__ import annotations

import subprocess

import httpx

from tests.proxy.helpers import eventually


def wait_healthy(process: subprocess.Popen, port: int, timeout: float = 30) -> None:
    """Until the proxy on ``port`` answers /healthz; fails if ``process`` exits first or ``timeout`` passes."""

    def healthy() -> bool:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        assert process.poll() is None, "pcp-proxy exited during start-up"
        return False

    eventually(healthy, timeout=timeout, interval=0.1, awaiting=f"pcp-proxy on port {port} to become healthy")
