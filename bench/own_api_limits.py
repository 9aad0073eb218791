"""The own API's limits, measured: memory and time of oversized requests, and one tenant's forget during another's import.

A real proxy process (``python -m proxy serve``, dense recall on: the bundled
encoder loaded before anything is measured) in front of the fake upstream in
another process. Resident memory is the proxy's (``/proc/PID/status``),
sampled every 20 ms while a request runs: "RSS up" is the peak less what it
was before. Prints the table kept in bench/results-2026-11-26.md.

    .venv/bin/python bench/own_api_limits.py [--pages 4000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.proxy.serving import free_port  # noqa: E402

A, B = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}


def page(pid: str, content: str) -> dict[str, Any]:
    return {
        "type": "Original", "id": pid, "origin": "Storage", "depth": 0, "timestamp": "2026-01-01T00:00:00",
        "keywords": ["orchard"], "summary": content[:80], "content": content,
    }  # fmt: skip


def prose(n_chars: int, seed: int = 0) -> str:
    words = ("orchard", "ledger", "apple", "graft", "pruning", "cider", "harvest", "frost", "blossom", "rootstock")
    out, i = [], seed
    size = 0
    while size < n_chars:
        word = f"{words[i % len(words)]}{i % 997}"
        out.append(word)
        size += len(word) + 1
        i += 7
    return " ".join(out)[:n_chars]


class Proxy:
    def __init__(self, upstream: str, data: Path, **settings: Any):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PCP_")}
        env.update({"PCP_DATA_DIR": str(data), "PCP_LOG_LEVEL": "warning", "HF_HUB_OFFLINE": "1", "PCP_API_KEYS": "key-a,key-b"})
        env.update({f"PCP_{k.upper()}": str(v) for k, v in settings.items()})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", str(self.port)], cwd=REPO, env=env, stdout=subprocess.DEVNULL
        )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.http.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the proxy did not start")
            time.sleep(0.1)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def measured(self, send: Callable[[], httpx.Response]) -> tuple[httpx.Response, float, float]:
        """The response, its seconds, and the peak resident memory above the start, in MB."""
        before = peak = self.rss_mb()
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.02):
                peak = max(peak, self.rss_mb())

        sampler = threading.Thread(target=sample)
        sampler.start()
        start = time.monotonic()
        try:
            answer = send()
        finally:
            seconds = time.monotonic() - start
            done.set()
            sampler.join()
        return answer, seconds, max(peak, self.rss_mb()) - before

    def warm(self) -> None:
        """The encoder loaded (both instances): a small import encodes, a scoped chat queues its texts."""
        self.http.post("/v1/pcp/memory/warm/import", content=_lines([page("w1", prose(400))]), headers=A)
        self.http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hello"}]}, headers={**A, "x-pcp-memory": "warm"})
        time.sleep(5)  # the request instance loads in the background: not measured

    def stop(self) -> None:
        self.http.close()
        self.process.terminate()
        self.process.wait(timeout=60)


def _lines(pages: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(p).encode() + b"\n" for p in pages)


def oversized(upstream: str, tmp: Path, rows: list[list[str]]) -> None:
    ten_mb = _lines([page("big", prose(10_000_000))])
    for label, settings in (("defaults", {}), ("page and import limits raised to 16/64 MiB", {"memory_page_max_kb": 16384, "memory_import_max_mb": 64})):
        proxy = Proxy(upstream, tmp / f"data-{len(rows)}", **settings)
        try:
            proxy.warm()
            answer, seconds, up = proxy.measured(lambda proxy=proxy: proxy.http.post("/v1/pcp/memory/big/import", content=ten_mb, headers=A))
            rows.append([f"10 MB page import ({label})", str(answer.status_code), f"{seconds:.2f}", f"{up:.0f}"])
            message = {"model": "m", "messages": [{"role": "user", "content": prose(10_000_000, 3)}]}
            answer, seconds, up = proxy.measured(
                lambda proxy=proxy, message=message: proxy.http.post("/v1/chat/completions", json=message, headers={**A, "x-pcp-memory": "chat"})
            )
            _drained(proxy)
            rows.append([f"10 MB message in a scoped chat ({label})", str(answer.status_code), f"{seconds:.2f}", f"{up:.0f} (answer; write-back after it)"])
        finally:
            proxy.stop()


def _drained(proxy: Proxy, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "pcp_memory_pending 0" not in proxy.http.get("/metrics").text.splitlines():
        time.sleep(0.2)


def hostile(upstream: str, tmp: Path, rows: list[list[str]]) -> None:
    proxy = Proxy(upstream, tmp / "data-hostile", hybrid="enabled")
    try:
        cases = [
            ("20 MB component", "POST", "/v1/pcp/sessions/s1/components", {"at": "d-1,1,0", "content": "x" * 20_000_000}),
            ("component ttl 2^64", "POST", "/v1/pcp/sessions/s1/components", {"at": "d-1,1,0", "content": "x", "ttl": 2**64}),
            ("component depth 10^23 in at", "POST", "/v1/pcp/sessions/s1/components", {"at": f"d{10**23},1,0", "content": "x"}),
            ("todo id 2^64", "PUT", "/v1/pcp/sessions/s1/todo", {"items": [{"id": 2**64, "title": "x"}]}),
            ("imported page depth 10^30", "POST", "/v1/pcp/memory/m/import", None),
            ("scope ending in a newline", "GET", "/v1/pcp/memory/alice%0A", None),
        ]
        for name, method, path, body in cases:
            content = _lines([{**page("p1", "x"), "depth": 10**30}]) if "import" in path else json.dumps(body).encode() if body is not None else None
            answer, seconds, up = proxy.measured(lambda method=method, path=path, content=content: proxy.http.request(method, path, content=content, headers=A))
            rows.append([name, str(answer.status_code), f"{seconds:.2f}", f"{up:.0f}"])
    finally:
        proxy.stop()


def fairness(upstream: str, tmp: Path, rows: list[list[str]], n_pages: int) -> None:
    proxy = Proxy(upstream, tmp / "data-fair")
    try:
        proxy.warm()
        proxy.http.post("/v1/pcp/memory/mine/import", content=_lines([page(f"b{i}", prose(300, i)) for i in range(20)]), headers=B)
        body = _lines([page(f"a{i}", prose(300, i)) for i in range(n_pages)])
        result: dict[str, Any] = {}

        def importing() -> None:
            start = time.monotonic()
            result["answer"] = proxy.http.post("/v1/pcp/memory/bulk/import", content=body, headers=A)
            result["seconds"] = time.monotonic() - start

        thread = threading.Thread(target=importing)
        thread.start()
        time.sleep(1.0)  # the import under way
        forgets: list[float] = []
        i = 0
        while thread.is_alive() and i < 20:
            start = time.monotonic()
            answer = proxy.http.post("/v1/pcp/memory/mine/forget", json={"ids": [f"b{i}"]}, headers=B)
            assert answer.status_code == 200, answer.text
            forgets.append(time.monotonic() - start)
            i += 1
            time.sleep(0.5)
        thread.join()
        during = sum(1 for _ in forgets)
        rows.append([f"{n_pages}-page import (key A)", str(result["answer"].status_code), f"{result['seconds']:.2f}", ""])
        rows.append([f"key B's forget during it ({during} sent, worst)", "200", f"{max(forgets):.2f}" if forgets else "n/a", ""])
        metrics = proxy.http.get("/metrics").text
        waits = [r for r in metrics.splitlines() if r.startswith("pcp_memory_write_wait_seconds_sum") or r.startswith("pcp_memory_write_wait_seconds_count")]
        print("\n".join(waits))
    finally:
        proxy.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=4000)
    args = parser.parse_args()
    upstream_port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "proxy.testing.upstream", "--port", str(upstream_port)], cwd=REPO, stdout=subprocess.DEVNULL)
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    rows: list[list[str]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            hostile(upstream, Path(tmp), rows)
            fairness(upstream, Path(tmp), rows, args.pages)
            oversized(upstream, Path(tmp), rows)
    finally:
        fake.terminate()
        fake.wait()
    print("| request | status | seconds | RSS up, MB |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
