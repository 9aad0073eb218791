"""Recall of a conversation's first paged request, where it crosses the Sentry's threshold, on LoCoMo through the real proxy.

A chat that grows through the proxy is forwarded untouched while it is under
the threshold; the request that first crosses it is the first paged, and it
gets the whole budget, as a conversation the proxy sees first whole does.
It is also the costliest request of the conversation: all of it is new to a
provider's cache, which holds the request before it. Priced as a follow-up
instead (its frame and a follow-up's share of the budget), it would cost
about half; this measures what either costs the request's recall.

Each LoCoMo dev conversation is cut at the first message where it, with the
question, is over the threshold (default 8,192): the request the chat sends
there. Every question (categories 1-4) whose evidence turns all come before
the cut is asked on it; each is a request of its own (another question is a
sibling: nothing is replayed). The simulated worker (``bench/simulated_worker.py``)
answers; recall counts a question when every evidence turn is in the worker's
prompt verbatim (the rows of ``bench/recall.py``).

Run it on two checkouts to compare them.

    .venv/bin/python bench/entry_recall.py [--budgets 4096] [--threshold 8192] [--bm25]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recall import DEFAULT_DATA, ENCODING, PROXY_ROWS, Message, ask_proxy, evidence_texts, load_data, proxy_outcomes, recall, running_proxy, user  # noqa: E402
from bench.simulated_worker import simulated_worker  # noqa: E402
from pcp_core.text.tokens import prompt_tokens  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402


def crossing(messages: Sequence[Message], question: str, threshold: int, count: Any) -> int:
    """The number of messages the chat has when, with ``question``, it first goes over ``threshold`` (0: never)."""
    for end in range(1, len(messages) + 1):
        if prompt_tokens([*messages[:end], user(question)], count) > threshold:
            return end
    return 0


def measure(budget: int, threshold: int, embeddings: bool, data: Path) -> tuple[list[list[Any]], int]:
    import httpx

    count = Tokenizer(ENCODING).count
    conversations, questions = load_data(data, [1, 2, 3, 4], None)
    outcomes: list[list[Any]] = [[] for _ in PROXY_ROWS]
    asked = 0
    with running_proxy(budget, simulated_worker, embeddings, sentry_threshold=threshold) as (fake, url), httpx.Client(timeout=300) as client:
        for question in questions:
            history = conversations[question.conv_id]
            end = crossing(history, question.text, threshold, count)
            if not end or max(question.evidence) >= end:
                continue
            messages = list(history[:end])
            response, calls = ask_proxy(client, url, fake, messages, question)
            if response.status_code != 200 or not calls:
                print(f"  {question.conv_id} q{question.qa_idx}: status {response.status_code}, {len(calls)} worker calls", file=sys.stderr)
                continue
            asked += 1
            for row, outcome in zip(outcomes, proxy_outcomes(question, messages, calls, count, evidence_texts(question, history))):
                row.append(outcome)
    return outcomes, asked


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--threshold", type=int, default=8192)
    parser.add_argument("--bm25", action="store_true", help="rank by BM25 alone (no embeddings)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    print(f"LoCoMo, each conversation cut where it first goes over {args.threshold:,} tokens; its questions with their evidence before the cut\n")
    print("| budget | questions | " + " | ".join(PROXY_ROWS) + " |")
    print("|---|---|" + "---|" * len(PROXY_ROWS))
    for budget in args.budgets:
        outcomes, asked = measure(budget, args.threshold, not args.bm25, args.data)
        print(f"| {budget:,} | {asked} | " + " | ".join(f"{recall(row) or 0:.3f}" for row in outcomes) + " |")


if __name__ == "__main__":
    main()
