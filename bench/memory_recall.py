"""Cross-conversation recall on LoCoMo: does what was said in earlier conversations reach the model through memory?

DESIGN §3's measure for P-Mem. Each LoCoMo conversation gets one memory
scope; each of its sessions (a ``[Session N …]`` line starts one) is sent
through the real proxy as a conversation of its own, in order, with
``x-pcp-memory: <scope>``. Once the scope's ``pending`` is 0, every question
is asked in a new conversation with no history (the question alone, in the
scope), in front of the simulated worker (``bench/simulated_worker.py``). A
question is recalled when every evidence turn appears verbatim in the
``<Content>`` of a worker prompt: of round 0, or of any prompt of the request
(≤ 3 Consults). Beside it, flat dense retrieval (MiniLM) over all the
conversation's turns at the same budget, the baseline of ``bench/recall.py``.

Two figures say where the misses are. The Memory Router's ceiling, as
``bench/ranking_ceiling.py`` gives the session Router's: walking down the
Router's order for the question (``GET …/pages?query=``, the first stage and
the ranking a request gets) and adding each Original page's tokens as a
Detail node, the share of questions whose evidence is all in before T
tokens (the Router's order without the request's time, so no fade). And
the distinct pages a request's prompts showed with their text, and their
tokens: how far down that order the rounds reached.

    .venv/bin/python bench/memory_recall.py [--budgets 2048 4096] [--embeddings] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from lxml import etree

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.ranking_ceiling import detail_node  # noqa: E402
from bench.recall import (  # noqa: E402
    DEFAULT_DATA,
    ENCODING,
    DenseRanker,
    ProxyStats,
    Row,
    baseline_outcome,
    category_counts,
    evidence_texts,
    fit_in_order,
    load_data,
    markdown_table,
    proxy_outcomes,
    recall,
    running_proxy,
)
from bench.simulated_worker import simulated_worker  # noqa: E402
from pcp_core.pages.logical import OriginalPage  # noqa: E402
from proxy.testing.apis import document_of  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

CEILING_TOKENS = (1500, 1800, 3500, 7000)

Message = dict[str, Any]


def sessions_of(messages: Sequence[Message]) -> list[list[Message]]:
    """The conversation cut where a ``[Session …]`` line starts a message."""
    sessions: list[list[Message]] = []
    for message in messages:
        if not sessions or message["content"].startswith("[Session"):
            sessions.append([])
        sessions[-1].append(message)
    return sessions


def remember(client: Any, url: str, scope: str, messages: Sequence[Message]) -> tuple[int, float]:
    """Send each session as its own conversation in ``scope``; wait until memory has stored them all."""
    started = time.perf_counter()
    sessions = sessions_of(messages)
    for session in sessions:
        response = client.post(f"{url}/v1/chat/completions", json={"model": "sim", "messages": session}, headers={"x-pcp-memory": scope})
        assert response.status_code == 200, response.text[:300]
    while client.get(f"{url}/v1/pcp/memory/{scope}").json()["pending"]:
        time.sleep(0.05)
    return len(sessions), time.perf_counter() - started


def ceiling_tokens(client: Any, url: str, scope: str, question: str, needles: Sequence[str], count: Any) -> float:
    """Tokens of the Memory Router's Original pages for ``question``, best first, until every needle is in (inf: never)."""
    response = client.get(f"{url}/v1/pcp/memory/{scope}/pages", params={"query": question, "limit": 200})
    assert response.status_code == 200, response.text[:300]
    spent, missing = 0, set(needles)
    for page in response.json()["data"]:
        if page["type"] != "Original":
            continue
        spent += count(detail_node(msgspec.convert(page, OriginalPage)))
        missing = {n for n in missing if n not in page["content"]}
        if not missing:
            return spent
    return float("inf")


def shown_pages(calls: Sequence[dict[str, Any]], count: Any) -> tuple[int, int]:
    """The distinct pages with <Content> in a request's worker prompts, and their tokens as Detail nodes."""
    nodes: dict[str, int] = {}
    for call in calls:
        for node in etree.fromstring(document_of(call["messages"]).encode()).iter("Node"):
            if node.find("Content") is not None and node.get("id") not in nodes:
                nodes[node.get("id", "")] = count(etree.tostring(node, encoding="unicode", with_tail=False))
    return len(nodes), sum(nodes.values())


def run(conversations: dict[str, list[Message]], questions: Sequence[Any], budget: int, count: Any, embeddings: bool) -> tuple[list[Row], str]:
    import httpx

    rows = [Row("pcp-proxy memory, round 0", []), Row("pcp-proxy memory, ≤3 Consults", [])]
    stats = ProxyStats()
    ceiling: list[float] = []
    shown: list[tuple[int, int]] = []
    started = time.perf_counter()
    with running_proxy(budget, simulated_worker, embeddings) as (fake, url), httpx.Client(timeout=300) as client:
        ingest = []
        for conv_id, messages in conversations.items():
            ingest.append(remember(client, url, conv_id, messages))
        status = {conv_id: client.get(f"{url}/v1/pcp/memory/{conv_id}").json() for conv_id in conversations}
        for question in questions:
            messages = conversations[question.conv_id]
            before = len(fake.requests)
            response = client.post(
                f"{url}/v1/chat/completions",
                json={"model": "sim", "messages": [{"role": "user", "content": question.text}]},
                headers={"x-pcp-memory": question.conv_id},
            )
            calls = [r.json for r in fake.requests[before:] if r.headers.get("x-pcp-role") == "worker"]
            stats.requests += 1
            if response.status_code != 200 or not calls or response.headers.get("x-pcp-mode") != "protocol":
                stats.failed += 1
                print(f"  {question.conv_id} q{question.qa_idx}: status {response.status_code}, {len(calls)} worker calls", file=sys.stderr)
                continue
            stats.worker_calls += len(calls)
            stats.most_calls = max(stats.most_calls, len(calls))
            needles = evidence_texts(question, messages)
            outcomes = proxy_outcomes(question, messages, calls, count, needles)
            ceiling.append(ceiling_tokens(client, url, question.conv_id, question.text, needles, count))
            shown.append(shown_pages(calls, count))
            rows[0].outcomes.append(outcomes[0])
            rows[1].outcomes.append(outcomes[1])
    stats.seconds = time.perf_counter() - started
    over = sum(o.max_prompt > budget for o in rows[1].outcomes)
    pages = sum(s["pages"] for s in status.values())
    exact = ", ".join(f"{row.method}: {recall(row.outcomes) or 0:.3f}" for row in rows)
    note = (
        f"{exact}\n"
        f"memory: {sum(n for n, _ in ingest)} sessions sent as conversations in {sum(t for _, t in ingest):.0f} s, "
        f"{pages} pages ({sum(s['originals'] for s in status.values())} Originals) in {len(status)} scopes\n"
        f"the Memory Router's ceiling (share with all evidence within T tokens of its order): "
        + ", ".join(f"T={t:,}: {sum(c <= t for c in ceiling) / max(len(ceiling), 1):.3f}" for t in CEILING_TOKENS)
        + f"\ndistinct pages a request's prompts showed: {sum(n for n, _ in shown) / max(len(shown), 1):.1f}, "
        f"{sum(t for _, t in shown) / max(len(shown), 1):,.0f} tokens (mean)\n" + stats.summary(budget, over)
    )
    return rows, note


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit", type=int, default=None, help="at most N questions per conversation")
    parser.add_argument("--embeddings", action="store_true", help="dense recall on (MiniLM), as the proxy's default")
    args = parser.parse_args(argv)
    count = Tokenizer(ENCODING).count
    categories = [1, 2, 3, 4]
    conversations, questions = load_data(args.data, categories, args.limit)
    print(
        f"LoCoMo {args.data.name}: {len(conversations)} conversations, {len(questions)} questions ({category_counts(questions, categories)}); each session its own conversation, questions in new ones\n"
    )
    rankings = DenseRanker().rankings(conversations, questions)
    for budget in args.budgets:
        dense = Row("flat dense (MiniLM), all turns", [])
        for q in questions:
            messages = conversations[q.conv_id]
            dense.outcomes.append(baseline_outcome(q, fit_in_order(rankings[q], messages, q.text, budget, count, skip=True), messages, count))
        rows, note = run(conversations, questions, budget, count, args.embeddings)
        print(markdown_table(budget, [dense, *rows], categories))
        print(f"\n{note}\n")


if __name__ == "__main__":
    main()
