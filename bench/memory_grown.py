"""Memory as it grows by what it is asked: the same questions on a clean scope and on one its other questions grew.

``bench/memory_recall.py`` measures a scope that holds only the conversations.
A real assistant's scope also receives every question put to it: each is
written back, and a question asked in a new conversation becomes a page of
its own (its answer never comes back). Three phases, each on its own proxy
(a fresh data dir: nothing of one phase reaches the next), each LoCoMo
conversation one scope whose sessions are sent first, each as its own
conversation (as ``memory_recall.py`` does):

* **clean** — then the sample (``--sample`` questions a conversation,
  chosen with ``--seed``), each in a new conversation;
* **grown** — then the conversation's other questions, in dataset order,
  then the same sample;
* **in order** — then all the conversation's questions in dataset order;
  recall of each fifth of them (the first fifth of every scope together, …);
* **in order, clean** — the same, each question's pages forgotten once it is
  answered, so every question meets a scope holding only the conversations:
  what each fifth recalls without the growth (LoCoMo's questions come
  grouped by kind, so the fifths differ for that alone).

A question is recalled as in ``memory_recall.py``: every evidence turn in the
``<Content>`` of a worker prompt, of round 0 or of any prompt of the request
(≤ 3 Consults), in front of the simulated worker. By default each question
waits, before the next is sent, until its write-back is stored and indexed
(``pending`` and ``indexing`` 0) and, with ``--embeddings``, until the
texts its rounds met are encoded; so does each session sent (the next one
recalls from the scope it left): every run of the same input then sees the
same scope. ``--no-wait`` sends them back to back, as a client would.

    .venv/bin/python bench/memory_grown.py [--budget 2048] [--embeddings] [--sample 20] [--phases clean grown order]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.memory_recall import sessions_of  # noqa: E402
from bench.recall import DEFAULT_DATA, ENCODING, Outcome, Question, evidence_texts, load_data, proxy_outcomes, running_proxy  # noqa: E402
from bench.simulated_worker import simulated_worker  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

Message = dict[str, Any]
PHASES = ("clean", "grown", "order", "order-clean")
FIFTHS = 5


@dataclass
class Phase:
    name: str
    measured: list[tuple[Question, int, Outcome, Outcome]] = field(default_factory=list)  # (question, its place in its scope, round 0, ≤3)
    asked: int = 0
    failed: int = 0
    seconds: float = 0.0
    status: dict[str, dict[str, Any]] = field(default_factory=dict)


def sample(questions: Sequence[Question], per_conversation: int, seed: int) -> list[Question]:
    """``per_conversation`` questions of each conversation, drawn with ``seed``, in dataset order."""
    rng = random.Random(seed)
    chosen: set[Question] = set()
    for conv_id in dict.fromkeys(q.conv_id for q in questions):
        own = [q for q in questions if q.conv_id == conv_id]
        chosen.update(rng.sample(own, min(per_conversation, len(own))))
    return [q for q in questions if q in chosen]


def settled(client: Any, url: str, scope: str, embeddings: bool) -> None:
    """Until the scope's write-backs are stored and indexed, and (dense) the texts the rounds met are encoded."""
    from proxy.testing.upstream import EMBEDDING_DONE, wait_for_background

    deadline = time.monotonic() + 600
    while True:
        status = client.get(f"{url}/v1/pcp/memory/{scope}").json()
        if not status["pending"] and not status.get("indexing", 0):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{scope}: still pending after 600 s: {status}")
        time.sleep(0.02)
    if embeddings:
        wait_for_background(lambda: client.get(f"{url}/metrics").text, "pcp_texts_embedded_total", EMBEDDING_DONE)


def run_phase(
    name: str,
    conversations: dict[str, list[Message]],
    asked: Sequence[tuple[Question, bool]],
    budget: int,
    count: Any,
    embeddings: bool,
    wait: bool,
    forget: bool = False,
    one_scope: bool = False,
) -> Phase:
    """One proxy: every conversation's sessions, then the questions ``asked`` in order (measured or not);
    ``forget``: each question's new pages forgotten once it is answered; ``one_scope``: all in one scope."""
    import httpx

    phase = Phase(name)
    started = time.perf_counter()
    scope_of: Callable[[str], str] = (lambda c: "locomo") if one_scope else (lambda c: c)
    places: dict[str, int] = {}
    with running_proxy(budget, simulated_worker, embeddings) as (fake, url), httpx.Client(timeout=300) as client:
        for conv_id, messages in conversations.items():
            for session in sessions_of(messages):
                response = client.post(f"{url}/v1/chat/completions", json={"model": "sim", "messages": session}, headers={"x-pcp-memory": scope_of(conv_id)})
                assert response.status_code == 200, response.text[:300]
                if wait:  # the next session meets the scope this one left (it recalls from it, in protocol mode)
                    settled(client, url, scope_of(conv_id), embeddings)
            settled(client, url, scope_of(conv_id), embeddings)
        held = {scope: page_ids(client, url, scope) for scope in {scope_of(c) for c in conversations}} if forget else {}
        for question, measured in asked:
            scope, messages = scope_of(question.conv_id), conversations[question.conv_id]
            place = places[question.conv_id] = places.get(question.conv_id, -1) + 1
            before = len(fake.requests)
            response = client.post(
                f"{url}/v1/chat/completions",
                json={"model": "sim", "messages": [{"role": "user", "content": question.text}]},
                headers={"x-pcp-memory": scope},
            )
            phase.asked += 1
            calls = [r.json for r in fake.requests[before:] if r.headers.get("x-pcp-role") == "worker"]
            if response.status_code != 200 or not calls:
                phase.failed += 1
                print(f"  {question.conv_id} q{question.qa_idx}: status {response.status_code}, {len(calls)} worker calls", file=sys.stderr)
            elif measured:
                outcomes = proxy_outcomes(question, messages, calls, count, evidence_texts(question, messages))
                phase.measured.append((question, place, outcomes[0], outcomes[1]))
            if wait or forget:
                settled(client, url, scope, embeddings)
            if forget:
                for pid in page_ids(client, url, scope) - held[scope]:
                    client.delete(f"{url}/v1/pcp/memory/{scope}/pages/{pid}")
        for scope in {scope_of(c) for c in conversations}:
            settled(client, url, scope, embeddings)
            phase.status[scope] = client.get(f"{url}/v1/pcp/memory/{scope}").json()
    phase.seconds = time.perf_counter() - started
    return phase


def page_ids(client: Any, url: str, scope: str) -> set[str]:
    ids: set[str] = set()
    cursor: str | None = "0"
    while cursor is not None:
        listed = client.get(f"{url}/v1/pcp/memory/{scope}/pages", params={"limit": 200, "cursor": cursor}).json()
        ids.update(page["id"] for page in listed["data"])
        cursor = listed["next_cursor"]
    return ids


def share(outcomes: Sequence[Outcome]) -> float:
    return sum(o.recalled for o in outcomes) / max(len(outcomes), 1)


def scope_line(phase: Phase) -> str:
    status = phase.status.values()
    total = {key: sum(int(s.get(key, 0)) for s in status) for key in ("pages", "originals", "records", "faded", "consulted")}
    return (
        f"{phase.name}: {phase.asked} questions asked ({phase.failed} failed) in {phase.seconds:.0f} s; "
        f"scopes hold {total['pages']} pages ({total['originals']} Originals, {total['records']} of them records), "
        f"{total['consulted']} pages ever consulted, {total['faded']} faded past a half-life"
    )


def fifths(phase: Phase, sizes: dict[str, int]) -> list[tuple[float, float, int]]:
    """Round 0 and ≤3 recall of each fifth of every scope's questions in order (the fifths of all scopes pooled)."""
    parts: list[list[tuple[Outcome, Outcome]]] = [[] for _ in range(FIFTHS)]
    for question, place, first, any_round in phase.measured:
        parts[min(place * FIFTHS // sizes[question.conv_id], FIFTHS - 1)].append((first, any_round))
    return [(share([a for a, _ in part]), share([b for _, b in part]), len(part)) for part in parts]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embeddings", action="store_true", help="dense recall on (MiniLM), as the proxy's default")
    parser.add_argument("--sample", type=int, default=20, help="questions a conversation measured clean and grown")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument("--no-wait", action="store_true", help="send each question as soon as the one before is answered")
    parser.add_argument("--one-scope", action="store_true", help="every conversation's sessions and questions in one scope")
    parser.add_argument("--outcomes", type=Path, default=None, help="write each measured question's outcome here (JSON lines), to compare runs")
    args = parser.parse_args(argv)
    count = Tokenizer(ENCODING).count
    conversations, questions = load_data(args.data, [1, 2, 3, 4], None)
    chosen = sample(questions, args.sample, args.seed)
    picked = set(chosen)
    of = {c: [q for q in questions if q.conv_id == c] for c in conversations}  # (their number: the fifths)
    print(
        f"LoCoMo {args.data.name}: {len(conversations)} conversations, {len(questions)} questions, a sample of {len(chosen)} "
        f"(seed {args.seed}); budget {args.budget:,}, {'BM25 + dense' if args.embeddings else 'BM25'}; "
        f"{'back to back' if args.no_wait else 'each question stored before the next'}\n"
    )
    # Dataset order is each conversation's questions in turn: with a scope each, "grown" asks every scope its other
    # questions before its sample, as with one scope for all (``--one-scope``).
    orders: dict[str, list[tuple[Question, bool]]] = {
        "clean": [(q, True) for q in chosen],
        "grown": [*((q, False) for q in questions if q not in picked), *((q, True) for q in chosen)],
        "order": [(q, True) for q in questions],
        "order-clean": [(q, True) for q in questions],
    }
    lines = ["| the same sample, asked… | round 0 | ≤ 3 Consults | n |", "|---|---|---|---|"]
    notes = []
    for name in args.phases:
        phase = run_phase(
            name, conversations, orders[name], args.budget, count, args.embeddings, not args.no_wait, forget=name == "order-clean", one_scope=args.one_scope
        )
        notes.append(scope_line(phase))
        if args.outcomes is not None:
            with args.outcomes.open("a") as out:
                for q, place, first, any_round in phase.measured:
                    out.write(
                        json.dumps({"phase": name, "conv": q.conv_id, "qa": q.qa_idx, "place": place, "round0": first.recalled, "consults": any_round.recalled})
                        + "\n"
                    )
        if name.startswith("order"):
            parts = fifths(phase, {c: len(of[c]) for c in conversations})
            notes.append(
                f"{'in order' if name == 'order' else 'in order, each question forgotten once answered'}, each fifth (round 0 / ≤3): "
                + ", ".join(f"{n + 1}: {a:.3f} / {b:.3f} ({k})" for n, (a, b, k) in enumerate(parts))
                + f"; all {share([o for *_, o, _ in phase.measured]):.3f} / {share([o for *_, o in phase.measured]):.3f}"
            )
            continue
        label = {"clean": "of a scope holding only the conversations", "grown": "after the scope was asked its other questions"}[name]
        first, any_round = [o for _, _, o, _ in phase.measured], [o for *_, o in phase.measured]
        lines.append(f"| {label} | {share(first):.3f} | {share(any_round):.3f} | {len(first)} |")
        print(f"{name}: {share(first):.3f} / {share(any_round):.3f}", file=sys.stderr)
    if len(lines) > 2:
        print("\n".join(lines) + "\n")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
