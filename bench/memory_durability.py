"""Memory survives ``kill -9``: no page the API listed is lost, no half-written write-back is read.

A real proxy process (``python -m proxy serve``) in front of a fake upstream
in another process. Clients send scoped conversations (each new, of 2–30
messages) as fast as the proxy takes them, while another lists the scope's
pages; after 1–4 s the proxy is killed with SIGKILL, mid-ingestion, and
started again on the same data directory. After each restart: every page
ever listed must be listed again, and every container's pages must be there
(a write-back is whole or absent). Repeated ``--kills`` times.

    .venv/bin/python bench/memory_durability.py [--kills 20]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
SCOPE = "durable"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not come up")


def start_proxy(data: Path, upstream: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PCP_DATA_DIR": str(data), "PCP_ROUTER_EMBEDDINGS": "false", "PCP_LOG_LEVEL": "warning", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def listed(client: httpx.Client, url: str) -> dict[str, dict[str, Any]]:
    """Every page the API lists now, by id."""
    pages: dict[str, dict[str, Any]] = {}
    cursor = "0"
    while cursor:
        body = client.get(f"{url}/v1/pcp/memory/{SCOPE}/pages", params={"limit": 200, "cursor": cursor}).json()
        pages.update((p["id"], p) for p in body["data"])
        cursor = body["next_cursor"]
    return pages


def talk(url: str, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            n = rng.randint(2, 30)
            tag = f"{seed}-{rng.random():.12f}"
            messages = [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"Note {tag} number {i}: the {rng.choice(['red', 'blue', 'green'])} {rng.choice(['kite', 'boat', 'lamp'])} is in room {rng.randint(1, 500)}.",
                }
                for i in range(n)
            ]
            try:
                client.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages}, headers={"x-pcp-memory": SCOPE})
            except httpx.HTTPError:
                return


def broken_containers(pages: dict[str, dict[str, Any]]) -> int:
    return sum(1 for p in pages.values() if any(child not in pages for child in p.get("source_ids", [])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="pcp-durability-"))
    upstream_port, port = free_port(), free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "proxy.testing.upstream", "--port", str(upstream_port)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    upstream, url = f"http://127.0.0.1:{upstream_port}/v1", f"http://127.0.0.1:{port}"
    ever: set[str] = set()
    lost = broken = 0
    try:
        time.sleep(1.0)
        for kill in range(args.kills + 1):
            proxy = start_proxy(data, upstream, port)
            wait_healthy(url)
            with httpx.Client(timeout=30) as client:
                now = listed(client, url)
                missing = ever - set(now)
                lost += len(missing)
                broken += broken_containers(now)
                print(
                    f"start {kill}: {len(now):,} pages listed, {len(missing)} of the {len(ever):,} listed before lost, {broken_containers(now)} containers missing a page",
                    flush=True,
                )
                if kill == args.kills:
                    proxy.terminate()
                    proxy.wait()
                    break
                stop = threading.Event()
                talkers = [threading.Thread(target=talk, args=(url, stop, 1000 * kill + i)) for i in range(3)]
                for t in talkers:
                    t.start()
                deadline = time.monotonic() + random.uniform(1.0, 4.0)
                while time.monotonic() < deadline:
                    ever |= set(listed(client, url))
                proxy.send_signal(signal.SIGKILL)
                proxy.wait()
                stop.set()
                for t in talkers:
                    t.join()
    finally:
        fake.terminate()
    print(f"\n{args.kills} kill -9 during ingestion: {len(ever):,} pages listed at some point, {lost} lost, {broken} containers found missing a page")


if __name__ == "__main__":
    main()
