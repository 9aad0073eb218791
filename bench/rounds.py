"""The proxy rows of ``bench/recall.py``, with the round engine driven in process: a policy change measured in seconds.

``pcp_core.engine.run_rounds`` is a generator of effects, so it needs no
server: each conversation is paged as the host pages it
(``proxy.testing.paged_session``), the simulated worker
(``bench/simulated_worker.py``) answers each worker call from its prompt, and
dense recall, with ``--embeddings``, gets the cosines the host's embedder
gives once a history is encoded (the steady state ``bench/recall.py
--embeddings`` waits for). What it leaves out is HTTP, the session store and
the background, in ~20 s a budget (BM25) instead of minutes. On the LoCoMo
dev split its BM25 rows are ``bench/recall.py``'s to the question (2,048
tokens: 0.76 / 0.80 / 0.79 / 0.64); with dense recall they differ by a
point at most (the proxy dates what it is sent by the clock, this by a fixed
time). Report the real proxy's figures; use this one to try a round policy.

    .venv/bin/python bench/rounds.py [--budgets 2048 4096] [--embeddings] [--vectors DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recall import DEFAULT_DATA, ENCODING, LEGEND, PROXY_ROWS, Row, category_counts, evidence_texts, load_data, markdown_table, proxy_outcomes  # noqa: E402
from bench.simulated_worker import worker_reply  # noqa: E402
from pcp_core.bm25 import Bm25Cache  # noqa: E402
from pcp_core.engine import CallRouter, CallWorker, RoundContext, RoundPolicy, Similarity, run_rounds  # noqa: E402
from pcp_core.replies import WorkerReply  # noqa: E402
from pcp_core.index import PageIndex  # noqa: E402
from pcp_core.router import dense_texts, unit_texts  # noqa: E402
from proxy.testing import paged_session  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

NOW = "2026-01-01T00:00:00"  # when the questions are asked: after every conversation
CACHE = Bm25Cache()


def worker_calls(index: PageIndex, question: str, budget: int, count: Any, embedder: Any) -> list[dict[str, Any]]:
    """The worker calls of one request, as bodies with their ``messages``."""
    loop = run_rounds(RoundContext(query=question, current_time=NOW, policy=RoundPolicy(budget=budget, max_rounds=4), dense=embedder is not None), index, count, CACHE)
    calls: list[dict[str, Any]] = []
    reply: Any = None
    try:
        while True:
            effect = loop.send(reply)
            if isinstance(effect, CallWorker):
                calls.append({"messages": effect.messages})
                reply = WorkerReply(text=worker_reply(effect.messages[0]["content"]))
            elif isinstance(effect, Similarity):
                reply = asyncio.run(embedder.similarities_when_ready(effect.query, effect.texts))
            else:
                assert not isinstance(effect, CallRouter), "no router model here"
                reply = None
    except StopIteration:
        return calls


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embeddings", action="store_true", help="dense recall on, as the proxy's default")
    parser.add_argument("--encoder", choices=["minilm", "mpnet"], default="minilm", help="the bundled encoder (PCP_EMBEDDINGS_MODEL)")
    parser.add_argument("--vectors", type=Path, default=None, help="keep the vectors here between runs (default: a temporary directory)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    tokenizer = Tokenizer(ENCODING)
    count = tokenizer.count
    conversations, questions = load_data(args.data, [1, 2, 3, 4], None)
    print(f"LoCoMo {args.data.name}: {len(conversations)} conversations, {len(questions)} questions ({category_counts(questions, [1, 2, 3, 4])}); the engine in process\n")
    sessions = {conv_id: paged_session(messages, count) for conv_id, messages in conversations.items()}
    with tempfile.TemporaryDirectory(prefix="pcp-rounds-") as scratch:
        embedder = None
        if args.embeddings:
            from proxy.embeddings import Embedder

            embedder = Embedder(args.vectors or Path(scratch), encoder=args.encoder, models_dir=(args.vectors or Path(scratch)).parent / "models")
            for session in sessions.values():  # the steady state: every page encoded
                embedder.embed_sync(dense_texts(unit_texts(session.pages.index().leaves())))
        label = f"engine (BM25 + {args.encoder})" if embedder else "engine"
        for budget in args.budgets:
            rows = [Row(f"{label}, {name}", []) for name in PROXY_ROWS]
            for question in questions:
                messages = conversations[question.conv_id]
                calls = worker_calls(sessions[question.conv_id].pages.index(), question.text, budget, tokenizer.count_built, embedder)
                for row, outcome in zip(rows, proxy_outcomes(question, messages, calls, count, evidence_texts(question, messages))):
                    row.outcomes.append(outcome)
            print(markdown_table(budget, rows, [1, 2, 3, 4]) + "\n")
        if embedder is not None:
            embedder.close()
    print(LEGEND)
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
