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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.prefix_cache import CACHE_FLOOR, Shares, shared_prefix  # noqa: E402
from bench.recall import DEFAULT_DATA, ENCODING, LEGEND, PROXY_ROWS, Row, category_counts, evidence_texts, load_data, markdown_table, proxy_outcomes, recall  # noqa: E402
from bench.simulated_worker import worker_reply  # noqa: E402
from pcp_core.directives.replies import WorkerReply  # noqa: E402
from pcp_core.effects import CallRouter, CallWorker, Similarity  # noqa: E402
from pcp_core.engine import run_rounds  # noqa: E402
from pcp_core.pages.index import PageIndex  # noqa: E402
from pcp_core.ranking.bm25 import Bm25Cache  # noqa: E402
from pcp_core.ranking.router import dense_texts, unit_texts  # noqa: E402
from pcp_core.round_policy import RoundContext, RoundPolicy  # noqa: E402
from pcp_core.text.tokens import prompt_tokens  # noqa: E402
from proxy.testing.apis import document_of  # noqa: E402
from proxy.testing.upstream import paged_session  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

NOW = "2026-01-01T00:00:00"  # when the questions are asked: after every conversation
CACHE = Bm25Cache()


def worker_calls(index: PageIndex, question: str, budget: int, count: Any, embedder: Any, **policy: Any) -> tuple[list[dict[str, Any]], Any]:
    """The worker calls of one request, as bodies with their ``messages``, and the frame its session keeps.

    Each question is asked of the same history, as ``bench/recall.py`` asks it: a sibling of the
    question before, which makes its frame again (``pcp_core.prompt.frame``). ``policy``: RoundPolicy fields to try.
    """
    rules = RoundPolicy(budget=budget, max_rounds=4, **policy)
    loop = run_rounds(RoundContext(query=question, current_time=NOW, policy=rules, dense=embedder is not None), index, count, CACHE)
    calls: list[dict[str, Any]] = []
    kept: Any = None
    reply: Any = None
    try:
        while True:
            effect = loop.send(reply)
            if isinstance(effect, CallWorker):
                kept = kept if calls else effect.frame
                calls.append({"messages": effect.messages})
                reply = WorkerReply(text=worker_reply(document_of(effect.messages)))
            elif isinstance(effect, Similarity):
                reply = asyncio.run(embedder.similarities_when_ready(effect.query, effect.texts))
            else:
                assert not isinstance(effect, CallRouter), "no router model here"
                reply = None
    except StopIteration:
        return calls, kept


@contextmanager
def steady_state(sessions: dict[str, Any], dense: bool, vectors: Path | None = None, encoder: str = "minilm") -> Iterator[Any]:
    """With ``dense``, the host's embedder with every page of ``sessions`` encoded (the steady state
    ``bench/recall.py --embeddings`` waits for; vectors kept in ``vectors``, or a temporary directory); else None."""
    if not dense:
        yield None
        return
    from proxy.recall.embeddings import Embedder

    with tempfile.TemporaryDirectory(prefix="pcp-rounds-") as scratch:
        directory = vectors or Path(scratch)
        embedder = Embedder(directory, encoder=encoder, models_dir=directory.parent / "models")
        embedder.load()  # both instances: until they are in, the host ranks by BM25 alone
        for session in sessions.values():
            embedder.embed_sync(dense_texts(unit_texts(session.pages.index().leaves())))
        try:
            yield embedder
        finally:
            embedder.close()


def one_budget(
    conversations: dict[str, Any],
    questions: Sequence[Any],
    sessions: dict[str, Any],
    budget: int,
    tokenizer: Tokenizer,
    embedder: Any,
    label: str,
    **tried: Any,
) -> str:
    """The rows of one budget, and the shares of the prompts a provider's cache could reuse.

    Each conversation's questions are asked one after the other, as ``bench/recall.py``
    sends them through the proxy: the session remembers each request's round 0 for the next.
    """
    count = tokenizer.count
    rows = [Row(f"{label}, {name}", []) for name in PROXY_ROWS]
    later, follow_ups = Shares(), Shares()
    remembered: dict[str, Any] = {}  # by conversation: the previous request's first prompt
    for question in questions:
        messages = conversations[question.conv_id]
        first = remembered.get(question.conv_id)
        calls, _ = worker_calls(sessions[question.conv_id].pages.index(), question.text, budget, tokenizer.count_built, embedder, **tried)
        remembered[question.conv_id] = calls[0]["messages"]
        if first is not None:
            follow_ups.add(shared_prefix(first, calls[0]["messages"], count), prompt_tokens(calls[0]["messages"], count), CACHE_FLOOR)
        for before, now in zip(calls, calls[1:]):
            later.add(shared_prefix(before["messages"], now["messages"], count), prompt_tokens(now["messages"], count), CACHE_FLOOR)
        for row, outcome in zip(rows, proxy_outcomes(question, messages, calls, count, evidence_texts(question, messages))):
            row.outcomes.append(outcome)
    lines = [markdown_table(budget, rows, [1, 2, 3, 4]), "", ", ".join(f"{row.method.split(', ')[-1]}: {recall(row.outcomes) or 0:.3f}" for row in rows)]
    for name, shares in (("later rounds", later), ("follow-ups (on the history)", follow_ups)):
        calls_n, hits, share, tokens = shares.cells()
        lines.append(f"{name}: {calls_n} calls, {hits} with a cached prefix (≥ {CACHE_FLOOR:,} tokens), {share} of the prompt ({tokens} tokens)")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embeddings", action="store_true", help="dense recall on, as the proxy's default")
    parser.add_argument("--keep-share", type=float, default=None, help="RoundPolicy.keep_share to try (default: the policy's)")
    parser.add_argument("--encoder", choices=["minilm", "mpnet"], default="minilm", help="the bundled encoder (PCP_EMBEDDINGS_MODEL)")
    parser.add_argument("--vectors", type=Path, default=None, help="keep the vectors here between runs (default: a temporary directory)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    tokenizer = Tokenizer(ENCODING)
    conversations, questions = load_data(args.data, [1, 2, 3, 4], None)
    print(
        f"LoCoMo {args.data.name}: {len(conversations)} conversations, {len(questions)} questions ({category_counts(questions, [1, 2, 3, 4])}); the engine in process\n"
    )
    sessions = {conv_id: paged_session(messages, tokenizer.count) for conv_id, messages in conversations.items()}
    tried = {} if args.keep_share is None else {"keep_share": args.keep_share}
    label = f"engine (BM25 + {args.encoder})" if args.embeddings else "engine"
    with steady_state(sessions, args.embeddings, args.vectors, args.encoder) as embedder:
        for budget in args.budgets:
            print(one_budget(conversations, questions, sessions, budget, tokenizer, embedder, label, **tried))
    print(LEGEND)
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
