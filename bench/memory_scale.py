"""Memory at scale: a scope of a million pages — ingest rate, Memory Router latency, cold open, resident memory.

Synthetic conversations (a Zipfian vocabulary of 40,000 made-up words, pages
of four turns, eight pages and a container each) are written into one scope
through ``proxy.memory.Memory`` as the writer thread writes a conversation's
pages (one transaction each, vectors, keyword and vector indexes kept in
step). Vectors come from a deterministic stand-in (each word a fixed random
384-dimensional vector, a page the normalised sum), as fast as the machine
allows: the figures are the store's and the indexes', not a model's.

Then: the Memory Router (first stage and second, no router model) for
queries of words drawn from random pages, warm, p50 / p99; the store closed,
opened again in a new process (``--open``), and the first query timed: the
cold open; resident memory (VmRSS) of both processes.

    .venv/bin/python bench/memory_scale.py [--pages 1000000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pcp_core import Conversation, OriginalPage, Policy  # noqa: E402
from pcp_core.memory import container_id  # noqa: E402
from pcp_core.pages.logical import ConsolidatedPage, Origin  # noqa: E402
from proxy.memory import Memory, SqliteMemoryStore  # noqa: E402

SCOPE = "bench/scale"
VOCABULARY = 40_000
DIM = 384
PAGES_PER_CONVERSATION = 8
WAVE = 2_000  # conversations queued before waiting for the writer (it consolidates and trains when idle)


class Words:
    def __init__(self, seed: int = 7):
        rng = np.random.default_rng(seed)
        syllables = ["ka", "lo", "mi", "ra", "tu", "ne", "si", "po", "ve", "da", "zo", "ri", "ma", "te", "ul", "an"]
        self.words = ["".join(rng.choice(syllables, size=rng.integers(2, 5))) + str(i % 97) for i in range(VOCABULARY)]
        ranks = np.arange(1, VOCABULARY + 1)
        self.p = (1 / ranks**1.07) / (1 / ranks**1.07).sum()
        self.rng = rng
        self.table = rng.standard_normal((VOCABULARY, DIM)).astype(np.float32)
        self.index = {w: i for i, w in enumerate(self.words)}

    def draw(self, n: int) -> Any:
        return self.rng.choice(VOCABULARY, size=n, p=self.p)


class FastStandIn:
    """A deterministic embedder: a text's vector is the normalised sum of its words' fixed random vectors."""

    ready = True

    def __init__(self, words: Words):
        self.words = words

    def vectors(self, texts: list[str]) -> Any:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            ids = [self.words.index[w] for w in text.split() if w in self.words.index]
            if ids:
                out[i] = self.words.table[ids].sum(axis=0)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def embed_sync(self, texts: list[str]) -> Any:
        return self.vectors(texts)


def conversation(words: Words, n: int) -> list[Any]:
    """Eight Original pages of four turns and the container over them."""
    pages: list[Any] = []
    drawn = words.draw(PAGES_PER_CONVERSATION * 60)
    day = f"20{20 + n % 6}-{1 + n % 12:02d}-{1 + n % 28:02d}T10:00:00"
    for p in range(PAGES_PER_CONVERSATION):
        chunk = [words.words[i] for i in drawn[p * 60 : (p + 1) * 60]]
        turns = [f"[{'user' if t % 2 == 0 else 'assistant'}] " + " ".join(chunk[t * 15 : (t + 1) * 15]) for t in range(4)]
        content = "\n".join(turns)
        keywords = tuple(sorted(set(chunk), key=lambda w: -words.index[w])[:6])
        pages.append(
            OriginalPage(
                id=f"c{n:07d}p{p}",
                origin=Origin.STORAGE,
                depth=2,
                timestamp=day,
                keywords=keywords,
                summary=" ".join(chunk[:25]),
                content=content,
                first_turn=4 * p,
                last_turn=4 * p + 3,
            )
        )
    ids = tuple(p.id for p in pages)
    summary = " ".join(p.summary.split()[0] for p in pages)
    pages.append(
        ConsolidatedPage(
            id=container_id(ids),
            origin=Origin.STORAGE,
            depth=1,
            timestamp=day,
            keywords=pages[0].keywords,
            summary=summary,
            content=summary,
            source_ids=ids,
            first_turn=0,
            last_turn=31,
        )
    )
    return pages


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def memory_at(directory: Path, words: Words) -> Memory:
    return Memory(directory, SqliteMemoryStore(directory / "memory.db"), policy=Policy(), count=lambda text: len(text.split()), embedder=FastStandIn(words))


def ingest(memory: Memory, words: Words, pages: int) -> float:
    conversations = pages // (PAGES_PER_CONVERSATION + 1)
    started = time.perf_counter()
    for n in range(conversations):
        built = conversation(words, n)
        memory.run(SCOPE, lambda built=built, n=n: memory.write_pages(SCOPE, built, owner=f"conversation-{n}"))
        if (n + 1) % WAVE == 0:
            memory.wait()
            done = (n + 1) * (PAGES_PER_CONVERSATION + 1)
            print(f"  {done:,} pages, {done / (time.perf_counter() - started):,.0f} pages/s, RSS {rss_mb():,.0f} MB", file=sys.stderr, flush=True)
    memory.wait()
    return time.perf_counter() - started


def queries(words: Words, n: int, seed: int = 11) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(words.words[i] for i in rng.choice(VOCABULARY // 4, size=rng.integers(3, 8))) for _ in range(n)]


def route(memory: Memory, texts: list[str]) -> list[float]:
    """Milliseconds of each query's Memory Router, as a request awaits it (one event loop, as the proxy's)."""
    policy = Policy()
    loop = asyncio.new_event_loop()
    times = []
    for text in texts:
        asked = Conversation.of([{"role": "user", "content": text}], policy.paging.blocks, lambda t: len(t.split()))
        started = time.perf_counter()
        loop.run_until_complete(memory.recall(SCOPE, asked, time.time_ns()))
        times.append((time.perf_counter() - started) * 1000)
    loop.close()
    return times


def open_cold(directory: Path) -> None:
    """In a new process: open the store, and time the first query (the cold open) and then warm ones."""
    words = Words()
    started = time.perf_counter()
    memory = memory_at(directory, words)
    memory.index(SCOPE)
    opened = time.perf_counter() - started
    first = route(memory, queries(words, 1, seed=99))[0]
    warm = route(memory, queries(words, 200, seed=5))
    print(
        json.dumps(
            {"open_s": opened, "first_query_ms": first, "p50": float(np.percentile(warm, 50)), "p99": float(np.percentile(warm, 99)), "rss_mb": rss_mb()}
        )
    )
    memory.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--open", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.open is not None:
        return open_cold(args.open)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="pcp-memory-scale-"))
    words = Words()
    memory = memory_at(directory, words)
    memory.index(SCOPE)  # open, as a serving proxy's is: every write keeps it in step
    seconds = ingest(memory, words, args.pages)
    stored = memory.store.counts(SCOPE)
    print(
        f"ingested {stored['originals'] + stored['consolidated']:,} pages in {seconds:.0f} s: {(stored['originals'] + stored['consolidated']) / seconds:,.0f} pages/s; RSS {rss_mb():,.0f} MB"
    )
    route(memory, queries(words, 20, seed=3))  # warm
    warm = route(memory, queries(words, 300))
    print(f"router, warm (300 queries): p50 {np.percentile(warm, 50):.1f} ms, p99 {np.percentile(warm, 99):.1f} ms; RSS {rss_mb():,.0f} MB")
    memory.close()
    result = subprocess.run([sys.executable, __file__, "--open", str(directory)], capture_output=True, text=True, check=True)
    cold = json.loads(result.stdout.strip().splitlines()[-1])
    print(
        f"cold open in a new process: {cold['open_s']:.2f} s, first query {cold['first_query_ms']:.0f} ms; then p50 {cold['p50']:.1f} ms, p99 {cold['p99']:.1f} ms; RSS {cold['rss_mb']:,.0f} MB"
    )
    disk = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    print(f"on disk: {disk / 2**20:,.0f} MB ({directory})")


if __name__ == "__main__":
    main()
