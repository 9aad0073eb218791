"""Memory survives kill -9 of a real proxy process mid-ingestion (``bench/memory_durability.py`` does it 20 times)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import httpx

from tests.proxy.helpers import eventually, free_port
from tests.proxy.serving import wait_healthy


def _serve(tmp_path, upstream: str, port: int) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PCP_")}, "PCP_DATA_DIR": str(tmp_path), "PCP_ROUTER_EMBEDDINGS": "false"}
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_healthy(process, port)
    return process


def _listed(url: str) -> dict[str, dict]:
    pages, cursor = {}, "0"
    while cursor:
        body = httpx.get(f"{url}/v1/pcp/memory/kept/pages", params={"limit": 200, "cursor": cursor}).json()
        pages.update((p["id"], p) for p in body["data"])
        cursor = body["next_cursor"]
    return pages


def _taken_in(url: str, ever: set[str], more: int) -> Callable[[], bool]:
    """Whether memory lists ``more`` pages beyond ``ever`` yet; what it lists joins ``ever``."""
    enough = len(ever) + more

    def grown() -> bool:
        ever.update(_listed(url))
        return len(ever) >= enough

    return grown


def _talk(url: str, stop: threading.Event) -> None:
    n = 0
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            n += 1
            messages = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"Conversation {n}, line {i}: the lamp is in room {n * 31 + i}."}
                for i in range(2 + n % 20)
            ]
            try:
                client.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages}, headers={"x-pcp-memory": "kept"})
            except httpx.HTTPError:
                return


def test_no_listed_page_is_lost_and_no_write_is_read_half_when_the_proxy_is_killed(served_upstream, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    ever: set[str] = set()
    for _ in range(2):
        process = _serve(tmp_path, served_upstream.url, port)
        now = _listed(url)
        assert ever <= set(now)
        assert all(child in now for page in now.values() for child in page.get("source_ids", []))
        stop = threading.Event()
        talker = threading.Thread(target=_talk, args=(url, stop))
        talker.start()
        eventually(_taken_in(url, ever, 20), timeout=30, awaiting="memory to list 20 more pages, mid-ingestion")  # then kill -9
        process.send_signal(signal.SIGKILL)
        process.wait()
        stop.set()
        talker.join()
    process = _serve(tmp_path, served_upstream.url, port)
    try:
        now = _listed(url)
        assert ever and ever <= set(now)
        assert all(child in now for page in now.values() for child in page.get("source_ids", []))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=15)
