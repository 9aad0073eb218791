"""What a large protocol-mode request costs the other requests the proxy serves meanwhile.

One proxy process (BM25 alone) in front of a fake upstream that answers at
once, each in its own process. A client sends short passthrough requests one
after another and times them: first alone ("quiet"), then while a second
client keeps sending protocol-mode follow-ups on a long conversation, paged
once before the clock starts ("loaded"). What the loaded column adds over the
quiet one is what the long conversation's requests hold the event loop for.
``--also NAME=DIR`` runs the same against other checkouts of the code, in
the same run (a change measured against the code before it).

    .venv/bin/python bench/mixed_load.py [--history-tokens 200000] [--requests 400] [--also before=DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.proxy_overhead import free_port, history, proxy_env, start_proxy, wait_until_up  # noqa: E402

SHORT = [{"role": "user", "content": "Say hi."}]


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def post(conn: http.client.HTTPConnection, messages: list[dict[str, str]], key: str) -> tuple[float, str]:
    body = json.dumps({"model": "fake-model", "messages": messages}).encode()
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
    response = conn.getresponse()
    response.read()
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status == 200, response.status
    return elapsed, response.getheader("x-pcp-mode") or ""


def passthrough_times(port: int, count: int) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    times = []
    for i in range(count):
        elapsed, mode = post(conn, [*SHORT, {"role": "user", "content": f"And {i}?"}], "sk-short")
        assert mode == "passthrough"
        times.append(elapsed)
    conn.close()
    return times


class LongConversation(threading.Thread):
    """Protocol-mode follow-ups on one long conversation, one after another, until stopped."""

    def __init__(self, port: int, messages: list[dict[str, str]]):
        super().__init__(daemon=True)
        self.port, self.messages = port, messages
        self.times: list[float] = []
        self.stop = threading.Event()

    def ask(self, conn: http.client.HTTPConnection, i: int) -> float:
        elapsed, mode = post(conn, [*self.messages, {"role": "user", "content": f"Question {i}: what moved the release?"}], "sk-long")
        assert mode == "protocol"
        return elapsed

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        i = 0
        while not self.stop.is_set():
            i += 1
            self.times.append(self.ask(conn, i))
        conn.close()


def measure(port: int, messages: list[dict[str, str]], requests: int) -> dict[str, list[float]]:
    long = LongConversation(port, messages)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    long.ask(conn, 0)  # paged once, cold, before any clock
    long.ask(conn, 0)  # and the session's first follow-up
    conn.close()
    quiet = passthrough_times(port, requests)
    long.start()
    while not long.times:  # the long conversation's requests are under way
        time.sleep(0.01)
    loaded = passthrough_times(port, requests)
    long.stop.set()
    long.join()
    return {"quiet": quiet, "loaded": loaded, "long": long.times}


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)  # its stores closed before the data dir goes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history-tokens", type=int, default=200_000)
    parser.add_argument("--requests", type=int, default=400, help="passthrough requests in each phase")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=DIR", help="another checkout to measure in the same run")
    args = parser.parse_args()
    targets = {"pcp-proxy": None, **{name: Path(path) for name, path in (a.split("=", 1) for a in args.also)}}
    messages = history(args.history_tokens)
    rows = []
    with tempfile.TemporaryDirectory() as data_dir:
        upstream_port = free_port()
        env = proxy_env(data_dir=data_dir, log_level="warning")
        procs = [subprocess.Popen([sys.executable, "-m", "proxy.testing.upstream", "--port", str(upstream_port)], env=env)]
        try:
            wait_until_up(upstream_port, "/v1/models")
            upstream = f"http://127.0.0.1:{upstream_port}/v1"
            for name, checkout in targets.items():
                port = free_port()
                procs.append(start_proxy(upstream, port, proxy_env(data_dir=f"{data_dir}/{name}", log_level="warning", router_embeddings=False), checkout))
                wait_until_up(port, "/healthz")
                times = measure(port, messages, args.requests)
                stop(procs.pop())
                rows.append((name, times))
        finally:
            for proc in procs:
                stop(proc)
    print(
        f"\nPassthrough requests ({args.requests} a phase, one client) alone and beside protocol-mode follow-ups on a {args.history_tokens:,}-token conversation (BM25 alone)\n"
    )
    print("| target | quiet p50 ms | p99 | max | loaded p50 ms | p99 | max | long follow-ups | their p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, t in rows:
        q, lo, long = t["quiet"], t["loaded"], t["long"]
        print(
            f"| {name} | {pct(q, 50):.2f} | {pct(q, 99):.2f} | {max(q):.2f} | {pct(lo, 50):.2f} | {pct(lo, 99):.2f} | {max(lo):.2f} | {len(long)} | {pct(long, 50):.1f} |"
        )


if __name__ == "__main__":
    main()
