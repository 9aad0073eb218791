"""Memory survives kill -9 of a real proxy process mid-ingestion (``bench/memory_durability.py`` does it 20 times)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(tmp_path, upstream: str, port: int) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PCP_")}, "PCP_DATA_DIR": str(tmp_path), "PCP_ROUTER_EMBEDDINGS": "false"}
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "pcp-proxy did not start"
        time.sleep(0.05)


def _listed(url: str) -> dict[str, dict]:
    pages, cursor = {}, "0"
    while cursor:
        body = httpx.get(f"{url}/v1/pcp/memory/kept/pages", params={"limit": 200, "cursor": cursor}).json()
        pages.update((p["id"], p) for p in body["data"])
        cursor = body["next_cursor"]
    return pages


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
    port = _free_port()
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
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            ever |= set(_listed(url))
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
