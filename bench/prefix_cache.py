"""How much of each worker prompt a provider's prompt cache could reuse, on LoCoMo through the real proxy.

OpenAI, vLLM and llama.cpp reuse the computation of a prompt's prefix when it
is byte-identical to that of a recent prompt (OpenAI from 1,024 tokens). For
each worker call this measures the longest prefix its messages share with
the call before it, cut back to a whole line of the document and counted
with tiktoken, and counts it only from ``--least`` tokens (1,024), as a
provider would:

* *later rounds*: each Consult round's prompt against the round before it,
  within one request;
* *follow-ups*: a request's first prompt against the first prompt of the
  request before it on the same conversation.

The proxy (``sentry_threshold=1024``, ``max_rounds=4``) stands in front of the
simulated worker (``bench/simulated_worker.py``), as in ``bench/recall.py``,
and dates its prompts by the clock, as it does in use. ``--shape chat`` asks
each conversation's questions as one chat would: the history, then every
earlier question and its answer, then the question; ``--shape history``
asks each against the history alone, as ``bench/recall.py`` does.

``--api messages`` asks through Anthropic's Messages API instead, in front of
a cache that keeps Anthropic's rules (``proxy.testing_prompt_cache``: an
entry only where a ``cache_control`` mark is, from 1,024 tokens, found only
at a block's end), and counts what each call reads from it.

    .venv/bin/python bench/prefix_cache.py [--budgets 4096] [--shape chat|history] [--api chat|messages] [--limit N] [--followup-share S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recall import DEFAULT_DATA, ENCODING, PROXY_ROWS, Message, ask_proxy, evidence_texts, load_data, proxy_outcomes, recall, running_proxy, user  # noqa: E402
from bench.simulated_worker import simulated_worker  # noqa: E402
from pcp_core.billing import billed, cached  # noqa: E402
from pcp_core.text.tokens import prompt_tokens  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

CACHE_FLOOR = 1024


def shared_prefix(previous: Sequence[dict[str, str]], current: Sequence[dict[str, str]], count: Any) -> int:
    """Tokens of the longest prefix ``current``'s messages share with ``previous``'s, to a whole line.

    A provider renders the messages one after the other; what both calls share
    is the messages they have in common whole, then the common start of the
    first that differs.
    """
    shared = 0
    for before, now in zip(previous, current):
        if before == now:
            shared += prompt_tokens([now], count) - 3  # its framing, less the reply priming
            continue
        common = os.path.commonprefix([before.get("content", ""), now.get("content", "")])
        common = common[: common.rfind("\n") + 1]
        return shared + (4 + count(common) if common else 0)  # its framing and role, then the common lines
    return shared


@dataclass
class Shares:
    """For each measured call: the share of its prompt a cache could reuse (0 below the floor), and the tokens."""

    shares: list[float] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)

    def add(self, shared: int, prompt: int, floor: int) -> None:
        reused = shared if shared >= floor else 0
        self.shares.append(reused / prompt)
        self.shared.append(reused)
        self.prompts.append(prompt)

    def cells(self) -> list[str]:
        if not self.shares:
            return ["0", "–", "–", "–"]
        hits = sum(1 for s in self.shared if s)
        return [
            f"{len(self.shares):,}",
            f"{hits / len(self.shares):.0%}",
            f"**{statistics.fmean(self.shares):.0%}**",
            f"{statistics.fmean(self.shared):,.0f} / {statistics.fmean(self.prompts):,.0f}",
        ]


@dataclass
class Bills:
    """For each follow-up request: its calls, what they were billed (cloud, a cached token at 0.1) and prefilled (local)."""

    calls: list[int] = field(default_factory=list)
    billed: list[float] = field(default_factory=list)
    prefilled: list[int] = field(default_factory=list)

    def add(self, shared: Sequence[int], sizes: Sequence[int]) -> None:
        self.calls.append(len(sizes))
        self.billed.append(sum(billed(size, cached(s), 0.1) for s, size in zip(shared, sizes)))
        self.prefilled.append(sum(size - s for s, size in zip(shared, sizes)))

    def line(self) -> str:
        if not self.calls:
            return "no follow-ups"
        n = len(self.calls)
        return f"{n:,} follow-ups, all their rounds: {sum(self.calls) / n:.2f} calls, billed {sum(self.billed) / n:,.0f}, prefilled {sum(self.prefilled) / n:,.0f} a request"


def compose(history: list[Message], asked: Sequence[tuple[str, str]], question: str, shape: str) -> list[Message]:
    if shape == "history":
        return [*history, user(question)]
    earlier = [m for q, a in asked for m in (user(q), {"role": "assistant", "content": a})]
    return [*history, *earlier, user(question)]


def measure(budget: int, shape: str, limit: int | None, data: Path, floor: int, **settings: Any) -> tuple[Shares, Shares, int, list[list[Any]], Bills]:
    import httpx

    tokenizer = Tokenizer(ENCODING)
    count = tokenizer.count
    conversations, questions = load_data(data, [1, 2, 3, 4], limit)
    rounds, follow_ups, over, bills = Shares(), Shares(), 0, Bills()
    outcomes: list[list[Any]] = [[] for _ in PROXY_ROWS]  # recall, each row of bench/recall.py's
    first_before: dict[str, list[dict[str, str]]] = {}
    asked: dict[str, list[tuple[str, str]]] = {}
    with running_proxy(budget, simulated_worker, False, **settings) as (fake, url), httpx.Client(timeout=300) as client:
        for question in questions:
            conv = question.conv_id
            messages = compose(conversations[conv], asked.setdefault(conv, []), question.text, shape)
            response, calls = ask_proxy(client, url, fake, messages, question, lambda m, q: m)
            if not calls:
                print(f"  {conv} q{question.qa_idx}: status {response.status_code}, no worker call", file=sys.stderr)
                continue
            prompts = [call["messages"] for call in calls]
            sizes = [prompt_tokens(p, count) for p in prompts]
            over += any(size > budget for size in sizes)
            later = [shared_prefix(before, now, count) for before, now in zip(prompts, prompts[1:])]
            for shared, size in zip(later, sizes[1:]):
                rounds.add(shared, size, floor)
            if conv in first_before:
                first = shared_prefix(first_before[conv], prompts[0], count)
                follow_ups.add(first, sizes[0], floor)
                bills.add([first, *later], sizes)
            first_before[conv] = prompts[0]
            needles = evidence_texts(question, conversations[conv])
            for row, outcome in zip(outcomes, proxy_outcomes(question, messages, calls, count, needles)):
                row.append(outcome)
            answer = response.json()["choices"][0]["message"]["content"] if response.status_code == 200 else ""
            asked[conv].append((question.text, answer))
    return rounds, follow_ups, over, outcomes, bills


def measure_messages(budget: int, shape: str, limit: int | None, data: Path) -> tuple[Shares, Shares, int]:
    """As ``measure``, through ``/v1/messages``: the share of each call's input Anthropic's cache rules would read."""
    import httpx

    from proxy.testing.prompt_cache import PromptCache

    conversations, questions = load_data(data, [1, 2, 3, 4], limit)
    cache = PromptCache(Tokenizer(ENCODING).count)
    rounds, follow_ups, over = Shares(), Shares(), 0
    asked: dict[str, list[tuple[str, str]]] = {}
    with running_proxy(budget, cache.replying(simulated_worker), False) as (_, url), httpx.Client(timeout=300) as client:
        for question in questions:
            conv = question.conv_id
            first = conv not in asked
            messages = compose(conversations[conv], asked.setdefault(conv, []), question.text, shape)
            before = len(cache.calls)
            response = client.post(f"{url}/v1/messages", json={"model": "sim", "max_tokens": 256, "messages": messages})
            calls = cache.calls[before:]
            if response.status_code != 200 or not calls:
                print(f"  {conv} q{question.qa_idx}: status {response.status_code}, {len(calls)} worker calls", file=sys.stderr)
                continue
            sizes = [sum(call.values()) for call in calls]
            over += any(size > budget for size in sizes)
            for call, size in zip(calls[1:], sizes[1:]):
                rounds.add(call["cache_read_input_tokens"], size, 0)
            if not first:
                follow_ups.add(calls[0]["cache_read_input_tokens"], sizes[0], 0)
            asked[conv].append((question.text, response.json()["content"][0]["text"]))
    return rounds, follow_ups, over


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[4096])
    parser.add_argument("--shape", choices=["chat", "history"], default="chat")
    parser.add_argument("--limit", type=int, default=None, help="at most N questions a conversation")
    parser.add_argument("--least", type=int, default=CACHE_FLOOR, help="shortest prefix a provider caches")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--api", choices=["chat", "messages"], default="chat", help="messages: Anthropic's API, its cache rules")
    parser.add_argument("--followup-share", type=float, default=None, help="PCP_FOLLOWUP_SHARE (what a follow-up adds, of the budget)")
    args = parser.parse_args(argv)
    print(
        f"LoCoMo {args.data.name}, questions asked as {'one chat a conversation' if args.shape == 'chat' else 'new requests on the history'}; a prefix counts from {args.least:,} tokens\n"
    )
    header = ["budget", "calls", "with a cached prefix", "share of the prompt (mean)", "cached / prompt tokens (mean)"]
    print("| " + " | ".join(["", *header]) + " |")
    print("|" + "---|" * (len(header) + 1))
    for budget in args.budgets:
        if args.api == "messages":
            rounds, follow_ups, over = measure_messages(budget, args.shape, args.limit, args.data)
            outcomes: list[list[Any]] = []
            bills = Bills()
        else:
            chosen = {"followup_share": args.followup_share} if args.followup_share is not None else {}
            rounds, follow_ups, over, outcomes, bills = measure(budget, args.shape, args.limit, args.data, args.least, **chosen)
        print(f"| later rounds | {budget:,} | " + " | ".join(rounds.cells()) + " |")
        print(f"| follow-ups | {budget:,} | " + " | ".join(follow_ups.cells()) + " |")
        if bills.calls:
            print(f"\n{bills.line()}")
        if outcomes:
            print("\nrecall, " + ", ".join(f"{name}: {recall(row) or 0:.3f}" for name, row in zip(PROXY_ROWS, outcomes)) + "\n")
        if over:
            print(f"\n{over} requests had a worker prompt over {budget:,} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
