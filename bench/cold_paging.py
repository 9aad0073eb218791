"""Cold paging as the history grows: the time a never-seen conversation takes, from 1k to 64k messages.

Each request is a conversation the proxy has not seen (a new caller key
each time), so its whole history is paged: counted, chained, split into
pages, grouped by topic, summarised, and then addressed for round 0. The
fake upstream answers at once; the proxy runs in its own process, as in
production, with BM25 alone (dense recall encodes in the background and
is not on the request's path). The goal is linear growth: at most twice
the time for twice the messages. Each size is sent ``--runs`` times and the
fastest is kept (the machines here are shared); the proxy's resident memory
is read after the largest. Besides the time each request takes, the proxy
process's CPU time for it is read from /proc (its background session
write included): the clock is inflated by whatever else the machine runs,
CPU time much less so, and the growth is judged on it.

    python bench/cold_paging.py [--sizes 1000 2000 4000 8000 16000 32000 64000] [--runs 2] [--history generated|varied]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.protocol_cost import NAMES, WORDS  # noqa: E402
from bench.proxy_overhead import free_port, proxy_env, start_proxy, wait_until_up  # noqa: E402

SYLLABLES = "ka lo mi ne ru ta po si ve zu bra ster qui dor fen".split()


def generated(n: int) -> list[dict[str, str]]:
    """Chat turns over one small vocabulary: every topic group shares most terms with every other."""
    rng = random.Random(n)
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"{rng.choice(NAMES)}: on day {i} we discussed the {' '.join(rng.choice(WORDS) for _ in range(rng.randint(12, 40)))}.",
        }
        for i in range(n)
    ]


def varied(n: int) -> list[dict[str, str]]:
    """Turns of made-up words: many terms, most of them rare, so topics seldom return."""
    rng = random.Random(n)
    word = lambda: "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))  # noqa: E731
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}: {' '.join(word() for _ in range(rng.randint(6, 20)))}"} for i in range(n)]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used (user + system): unlike the clock, not inflated by other processes' load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settled_cpu(pid: int) -> float:
    """The process's CPU time once it has gone quiet (its background session write done)."""
    last = cpu_seconds(pid)
    while True:
        time.sleep(0.3)
        now = cpu_seconds(pid)
        if now - last < 0.02:
            return now
        last = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000, 8000, 16000, 32000, 64000])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--history", choices=["generated", "varied"], default="generated")
    args = parser.parse_args()
    make = generated if args.history == "generated" else varied
    upstream_port, proxy_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as data:
        env = proxy_env(data_dir=data, log_level="warning", router_embeddings=False, sentry_threshold=1024, paging_timeout=3600, request_timeout=3600)
        fake = subprocess.Popen([sys.executable, "-m", "proxy.testing.upstream", "--port", str(upstream_port)], env=env)
        proxy = start_proxy(f"http://127.0.0.1:{upstream_port}/v1", proxy_port, env)
        try:
            wait_until_up(upstream_port, "/v1/models")
            wait_until_up(proxy_port, "/healthz")
            rows = measure(proxy_port, proxy.pid, args.sizes, args.runs, make)
            memory = rss_mb(proxy.pid)
        finally:
            proxy.terminate()
            fake.terminate()
            proxy.wait()
            fake.wait()
    report(rows, memory, args)


def measure(port: int, pid: int, sizes: list[int], runs: int, make) -> list[tuple[int, int, float, float]]:
    """(messages, body bytes, fastest wall time, least proxy CPU time) of each size."""
    rows = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=3600) as client:
        for n in sizes:
            body = json.dumps({"model": "fake-model", "messages": [*make(n), {"role": "user", "content": "What did we say about the garden budget?"}]}).encode()
            walls, cpus = [], []
            for run in range(runs):
                before = settled_cpu(pid)
                start = time.perf_counter()
                response = client.post(
                    "/v1/chat/completions", content=body, headers={"authorization": f"Bearer cold-{n}-{run}", "content-type": "application/json"}
                )
                walls.append(time.perf_counter() - start)
                cpus.append(settled_cpu(pid) - before)
                assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol", response.text[:300]
            rows.append((n, len(body), min(walls), min(cpus)))
            print(f"  {n:>6,} messages: {min(walls):.2f} s, proxy CPU {min(cpus):.2f} s", file=sys.stderr, flush=True)
    return rows


def report(rows: list[tuple[int, int, float, float]], memory: float, args: argparse.Namespace) -> None:
    print(f"\nCold paging, {args.history} history, best of {args.runs} runs, BM25 alone; proxy RSS after the last: {memory:.0f} MB\n")
    print("| messages | body MB | time s | proxy CPU s | CPU ms per 1k messages | CPU ÷ previous row's (goal ≤ 2) | time ÷ previous row's |")
    print("|---|---|---|---|---|---|---|")
    previous = None
    for n, size, wall, cpu in rows:
        ratios = (f"{cpu / previous[1]:.2f}", f"{wall / previous[0]:.2f}") if previous else ("—", "—")
        print(f"| {n:,} | {size / 2**20:.1f} | {wall:.2f} | {cpu:.2f} | {cpu / n * 1e6:.0f} | {ratios[0]} | {ratios[1]} |")
        previous = (wall, cpu)


if __name__ == "__main__":
    main()
