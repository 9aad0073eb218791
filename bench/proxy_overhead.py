"""Latency the proxy adds in passthrough mode, against calling the upstream directly.

Three processes on loopback: a fake upstream that answers at once, pcp-proxy in
front of it, and, as a reference point, a bare 30-line httpx forwarder
(bench/bare_forwarder.py). The same load goes to all three in one run,
interleaved in rounds so that machine noise hits them alike:

* one client, sequential requests: p50/p95 latency, and what each adds over direct;
* 16 concurrent clients: p50/p95 and throughput relative to direct;
* one client, a chat completion (read, measured, forwarded) against a forwarded
  ``/v1/embeddings`` call (the same texts as input, 1,536-dimension vectors back):
  what each adds over direct, and the difference of the two at p50.

Each request carries a realistic history (default ~2k tokens) whose last user
message is new every time, as in a live conversation.

    python bench/proxy_overhead.py [--requests 2000] [--history-tokens 2000]
    python bench/proxy_overhead.py --endpoints-only   # the third table alone
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(port: int, path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}").status_code < 500:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"server on port {port} did not come up")


def proxy_env(**settings: Any) -> dict[str, str]:
    """This environment with ``settings`` as PCP_* variables, and no PCP_* variable of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PCP_")}
    env.update({f"PCP_{name.upper()}": str(value).lower() if isinstance(value, bool) else str(value) for name, value in settings.items()})
    return env


def start_proxy(upstream: str, port: int, env: dict[str, str], checkout: Path | None = None) -> subprocess.Popen:
    """``pcp-proxy serve`` in a process of its own, as in production; ``checkout``: another copy of the code (its packages are imported first)."""
    return subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", str(port)], env=env, cwd=checkout)


def start_servers(data_dir: str, others: dict[str, Path] | None = None) -> tuple[dict[str, int], list[subprocess.Popen]]:
    """The upstream, the bare forwarder and pcp-proxy twice: as configured by default (dense recall on), and with BM25 alone;
    ``others``: pcp-proxy from other checkouts, by name (a change measured against the code before it, in one run)."""
    ports = {"direct": free_port(), "bare forwarder": free_port(), "pcp-proxy": free_port(), "pcp-proxy, BM25 only": free_port()}
    upstream = f"http://127.0.0.1:{ports['direct']}/v1"
    env = {**proxy_env(data_dir=data_dir, log_level="warning"), "UPSTREAM": upstream}
    procs = [subprocess.Popen([sys.executable, "-m", "proxy.testing.upstream", "--port", str(ports["direct"])], env=env)]
    try:  # a server that does not come up leaves none of the others running
        wait_until_up(ports["direct"], "/v1/models")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "bare_forwarder:app",
                    "--app-dir",
                    str(HERE),
                    "--port",
                    str(ports["bare forwarder"]),
                    "--log-level",
                    "warning",
                    "--no-access-log",
                ],
                env=env,
            )
        )
        procs.append(start_proxy(upstream, ports["pcp-proxy"], env))
        bm25_only = proxy_env(data_dir=f"{data_dir}/bm25", log_level="warning", router_embeddings=False)
        procs.append(start_proxy(upstream, ports["pcp-proxy, BM25 only"], bm25_only))
        for name, checkout in (others or {}).items():
            ports[name] = free_port()
            procs.append(start_proxy(upstream, ports[name], proxy_env(data_dir=f"{data_dir}/{len(ports)}", log_level="warning"), checkout))
        for name in ports:
            wait_until_up(ports[name], "/healthz" if name.startswith("pcp") else "/v1/models")
    except BaseException:
        for proc in procs:
            proc.terminate()
        raise
    return ports, procs


def history(tokens: int) -> list[dict[str, str]]:
    line = "We moved the release of build 4.2.1 to Thursday 14 March because the migration on db-07 took 3 hours. "
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    while sum(len(m["content"]) for m in messages) < tokens * 4:
        role = "user" if len(messages) % 2 else "assistant"
        messages.append({"role": role, "content": f"Turn {len(messages)}: {line * 3}"})
    return messages


class Body:
    """A request body whose last user message is new on every call."""

    path = "/v1/chat/completions"

    def __init__(self, history_tokens: int):
        self.messages = history(history_tokens)
        self.n = 0

    def __call__(self) -> bytes:
        self.n += 1
        messages = [*self.messages, {"role": "user", "content": f"Question {self.n}: what moved the release?"}]
        return json.dumps({"model": "fake-model", "messages": messages, "temperature": 0}).encode()


class EmbeddingsBody(Body):
    """An embeddings request: the history's messages and a new question, one input each (``batch``), as a
    RAG app indexes a conversation; or the new question alone, as it embeds a query."""

    path = "/v1/embeddings"

    def __init__(self, history_tokens: int, batch: bool = True):
        super().__init__(history_tokens)
        self.batch = batch

    def __call__(self) -> bytes:
        self.n += 1
        texts = [m["content"] for m in self.messages] if self.batch else []
        texts.append(f"Question {self.n}: what moved the release?")
        return json.dumps({"model": "text-embedding-3-small", "input": texts, "dimensions": 1536}).encode()


def sequential(port: int, body: Body, count: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    times = []
    for _ in range(count):
        payload = body()
        start = time.perf_counter()
        conn.request("POST", body.path, payload, headers)
        response = conn.getresponse()
        response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200, response.status
    conn.close()
    return times


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes, headers: str = "") -> bytes:
    """One chat completion on a kept-alive connection (``headers``: more header lines, each ending in CRLF); its status line."""
    head = f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{headers}content-length: {len(payload)}\r\n\r\n"
    writer.write(head.encode() + payload)
    status_line = await reader.readline()
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    return status_line


async def concurrent(port: int, body: Body, count: int, clients: int) -> tuple[list[float], float]:
    """``clients`` keep-alive connections, each sending its share back to back.

    A minimal HTTP/1.1 client on asyncio streams: a full-featured async client
    costs more per request than the servers it measures.
    """
    times: list[float] = []

    async def worker(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(n):
            payload = body()
            start = time.perf_counter()
            status_line = await exchange(reader, writer, payload, "authorization: Bearer sk-bench\r\n")
            times.append(time.perf_counter() - start)
            assert b" 200 " in status_line, status_line
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker(count // clients) for _ in range(clients)))
    return times, len(times) / (time.perf_counter() - start)


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used (user + system), from /proc: what it costs whatever else the machine does."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else values[0] * 1000


def endpoints(ports: dict[str, int], args: argparse.Namespace) -> dict[tuple[str, str], list[float]]:
    """Sequential latency of a chat completion and of forwarded embeddings calls, direct and through each forwarder, interleaved."""
    bodies = {
        "chat completion": Body(args.history_tokens),
        "embeddings, one text (forwarded)": EmbeddingsBody(args.history_tokens, batch=False),
        f"embeddings, {len(Body(args.history_tokens).messages) + 1} texts (forwarded)": EmbeddingsBody(args.history_tokens),
    }
    targets = dict(ports)
    times: dict[tuple[str, str], list[float]] = {(kind, name): [] for kind in bodies for name in targets}
    per_round = max(args.requests // args.rounds, 1)
    for _ in range(args.rounds):
        for kind, body in bodies.items():
            for name, port in targets.items():
                times[kind, name] += sequential(port, body, per_round)
    return times


def print_endpoints(times: dict[tuple[str, str], list[float]]) -> None:
    kinds = list(dict.fromkeys(kind for kind, _ in times))
    print(
        f"\nChat completion (passthrough) against forwarded /v1/embeddings calls (1,536-dimension vectors back), one client, {len(times[kinds[0], 'direct'])} sequential requests of each per target\n"
    )
    print("| request | direct p50 ms | pcp-proxy p50 ms | added p50 ms | added p95 ms | bare forwarder: added p50 ms |")
    print("|---|---|---|---|---|---|")
    added = {}
    for kind in kinds:
        direct, proxied, bare = times[kind, "direct"], times[kind, "pcp-proxy"], times[kind, "bare forwarder"]
        added[kind] = pct(proxied, 50) - pct(direct, 50)
        print(
            f"| {kind} | {pct(direct, 50):.2f} | {pct(proxied, 50):.2f} | {added[kind]:+.2f} | {pct(proxied, 95) - pct(direct, 95):+.2f} | {pct(bare, 50) - pct(direct, 50):+.2f} |"
        )
    chat, *forwarded = kinds
    for kind in forwarded:
        print(f"\n{kind}: {added[kind] - added[chat]:+.2f} ms at p50 against a chat completion.", end="")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per target")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--history-tokens", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--endpoints-only", action="store_true", help="only compare a chat completion with a forwarded embeddings call")
    parser.add_argument(
        "--also", action="append", default=[], metavar="NAME=DIR", help="also measure pcp-proxy from another checkout (the code before a change, say)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as data_dir:
        ports, procs = start_servers(data_dir, dict((name, Path(path).resolve()) for name, _, path in (a.partition("=") for a in args.also)))
        try:
            body = Body(args.history_tokens)
            for port in ports.values():
                sequential(port, body, 200)  # warm-up: connections, caches, JIT-free but lazy imports
                sequential(port, EmbeddingsBody(args.history_tokens), 50)
            if args.endpoints_only:
                print_endpoints(endpoints(ports, args))
                return
            pids = dict(zip(ports, (proc.pid for proc in procs)))
            cpu: dict[str, float] = dict.fromkeys(ports, 0.0)  # each server's CPU seconds over its sequential requests
            seq: dict[str, list[float]] = {name: [] for name in ports}
            conc: dict[str, list[float]] = {name: [] for name in ports}
            rps: dict[str, list[float]] = {name: [] for name in ports}
            per_round = max(args.requests // args.rounds, 1)
            # Every client sends at least one request a round: a share of 0 would measure nothing.
            concurrent_per_round = max(per_round * 2, args.clients)
            for _ in range(args.rounds):
                for name, port in ports.items():
                    before = cpu_seconds(pids[name])
                    seq[name] += sequential(port, body, per_round)
                    cpu[name] += cpu_seconds(pids[name]) - before
                for name, port in ports.items():
                    times, throughput = asyncio.run(concurrent(port, body, concurrent_per_round, args.clients))
                    conc[name] += times
                    rps[name].append(throughput)
            by_endpoint = endpoints(ports, args)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=10)

    tokens = args.history_tokens
    print(
        f"\nPassthrough overhead, one run, {len(seq['direct'])} sequential + {len(conc['direct'])} concurrent requests per target, ~{tokens}-token history, new last message each request\n"
    )
    print(
        "| target | 1 client p50 ms | p95 ms | added p50 ms | added p95 ms | its own CPU µs a request | 16 clients p50 ms | p95 ms | added p50 ms | throughput vs direct |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = {"s50": pct(seq["direct"], 50), "s95": pct(seq["direct"], 95), "c50": pct(conc["direct"], 50), "rps": statistics.median(rps["direct"])}
    for name in ports:
        s50, s95, c50, c95 = pct(seq[name], 50), pct(seq[name], 95), pct(conc[name], 50), pct(conc[name], 95)
        ratio = statistics.median(rps[name]) / base["rps"]
        added = lambda v, k, name=name: "—" if name == "direct" else f"{v - base[k]:+.2f}"  # noqa: E731
        own = cpu[name] / len(seq[name]) * 1e6
        print(
            f"| {name} | {s50:.2f} | {s95:.2f} | {added(s50, 's50')} | {added(s95, 's95')} | {own:.0f} | {c50:.2f} | {c95:.2f} | {added(c50, 'c50')} | {ratio:.2f} |"
        )
    print(
        "\nIts own CPU: what each server process used over its sequential requests, per request (for direct, the fake upstream's):"
        " unlike latency, it does not grow with what else the machine runs."
    )
    print_endpoints(by_endpoint)


if __name__ == "__main__":
    main()
