"""Evidence recall on short-turn chats: LoCoMo's conversations reshaped as a messaging app's.

Real messaging-app chats differ from LoCoMo's tidy sessions: hundreds of short
messages, several in a row from one person, each with its own timestamp, and
the evidence of a question one short message among them (or several, days
apart). This reshapes each LoCoMo dev conversation that way, without reading
any held-out data:

* every turn is cut into its sentences, one message each (a sentence under
  ``--min-chars`` joins the next), said by the same person (``Name: …``);
* the session headers go: each message carries its own ``timestamp`` field
  (``08.05.2023 13:57``: the session's time, a minute a message), as an
  export of a messaging app does;
* a question's evidence is, for each of its evidence turns, the one message
  of it that shares the most words with the question and its answer.

``--shape pairs`` cuts each turn in two messages of about equal length
instead (a middle shape); ``--shape locomo`` keeps the conversations as they
are (the evidence: whole turns, as ``bench/recall.py`` counts it).

Rows, at each budget: flat dense retrieval (messages by MiniLM cosine while
they fit, as ``bench/recall.py``'s baseline) and the round engine in process
(``bench/rounds.py``: round 0, ≤ 3 Consults, one prompt, answering prompt),
with BM25 alone or, with ``--embeddings``, the default dense recall.

    .venv/bin/python bench/short_turns.py [--shape messages|pairs|locomo] [--budgets 2048 4096] [--embeddings]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recall import (  # noqa: E402
    DEFAULT_DATA,
    ENCODING,
    LEGEND,
    PROXY_ROWS,
    DenseRanker,
    Message,
    Question,
    Row,
    baseline_outcome,
    category_counts,
    fit_in_order,
    load_data,
    markdown_table,
    proxy_outcomes,
)
from bench.rounds import steady_state, worker_calls  # noqa: E402
from pcp_core.prompt.markup import xml_safe  # noqa: E402
from proxy.testing.upstream import paged_session  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

_HEADER = re.compile(r"^\[Session \d+ - (\d{1,2}:\d{2} [ap]m) on (\d{1,2} \w+, \d{4})\]\n")
_SPEAKER = re.compile(r"^([^:\n]{1,40}): ")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)")
_WORD = re.compile(r"[a-z0-9]+")
STOP = frozenset(
    "a an the and or but of to in on at by for with from is are was were be been i you he she it we they my your his her our their what when where who how did do does that this".split()
)


def sentences(text: str, min_chars: int) -> list[str]:
    """``text`` cut after each sentence; a piece shorter than ``min_chars`` joins the next."""
    pieces, carry = [], ""
    for sentence in _SENTENCE.split(text.strip()):
        carry = f"{carry} {sentence}".strip()
        if len(carry) >= min_chars:
            pieces.append(carry)
            carry = ""
    if carry:
        pieces = [*pieces[:-1], f"{pieces[-1]} {carry}"] if pieces else [carry]
    return pieces


def halves(text: str, min_chars: int) -> list[str]:
    """``text`` in two messages of about equal length, cut between sentences (one message when it has one sentence)."""
    parts = _SENTENCE.split(text.strip())
    if len(parts) < 2:
        return [text.strip()]
    lengths = [len(p) for p in parts]
    cut = min(range(1, len(parts)), key=lambda i: abs(sum(lengths[:i]) - sum(lengths[i:])))
    return [" ".join(parts[:cut]), " ".join(parts[cut:])]


def reshaped(messages: Sequence[Message], split: Any, min_chars: int) -> tuple[list[Message], list[list[int]]]:
    """The conversation as a messaging app's: its messages, and for each original turn the messages it became."""
    out: list[Message] = []
    pieces_of: list[list[int]] = []
    when = datetime(2023, 1, 1)
    for message in messages:
        text = message["content"]
        header = _HEADER.match(text)
        if header:
            when = datetime.strptime(f"{header.group(2)} {header.group(1)}", "%d %B, %Y %I:%M %p")
            text = text[header.end() :]
        speaker = _SPEAKER.match(text)
        name, said = (speaker.group(1), text[speaker.end() :]) if speaker else ("", text)
        pieces_of.append([])
        for piece in split(said, min_chars):
            pieces_of[-1].append(len(out))
            out.append({"role": message["role"], "content": f"{name}: {piece}" if name else piece, "timestamp": when.strftime("%d.%m.%Y %H:%M")})
            when += timedelta(minutes=1)
    return out, pieces_of


def best_piece(pieces: Sequence[int], messages: Sequence[Message], asked: str) -> int:
    """The message of a turn that shares the most words with what is asked (the question and its answer); the first on a tie."""
    wanted = set(_WORD.findall(asked.lower())) - STOP
    return max(pieces, key=lambda i: (len(wanted & set(_WORD.findall(messages[i]["content"].lower()))), -i))


def short_turn_data(
    conversations: dict[str, list[Message]], questions: Sequence[Question], answers: dict[tuple[str, int], str], shape: str, min_chars: int
) -> tuple[dict[str, list[Message]], list[Question]]:
    if shape == "locomo":
        return conversations, list(questions)
    split = sentences if shape == "messages" else halves
    shaped, pieces = {}, {}
    for conv_id, messages in conversations.items():
        shaped[conv_id], pieces[conv_id] = reshaped(messages, split, min_chars)
    moved = []
    for q in questions:
        asked = f"{q.text} {answers.get((q.conv_id, q.qa_idx), '')}"
        evidence = tuple(sorted({best_piece(pieces[q.conv_id][i], shaped[q.conv_id], asked) for i in q.evidence}))
        moved.append(replace(q, evidence=evidence))
    return shaped, moved


def load_answers(data: Path) -> dict[tuple[str, int], str]:
    from bench.recall import read_jsonl

    return {(row["conv_id"], row["qa_idx"]): str(row.get("answer", "")) for row in read_jsonl(data / "questions.jsonl")}


def needles(question: Question, messages: Sequence[Message]) -> list[str]:
    """What must reach a prompt: each evidence message's text (the proxy shows a message's content as it is)."""
    return [xml_safe(messages[i]["content"]) for i in question.evidence]


def flat_dense(conversations: dict[str, list[Message]], questions: Sequence[Question], budget: int, count: Any, dense: DenseRanker) -> Row:
    rankings = dense.rankings({c: [{"content": m["content"]} for m in ms] for c, ms in conversations.items()}, questions)
    row = Row("flat dense (MiniLM)", [])
    for q in questions:
        messages = [{"role": m["role"], "content": m["content"]} for m in conversations[q.conv_id]]
        row.outcomes.append(baseline_outcome(q, fit_in_order(rankings[q], messages, q.text, budget, count, skip=True), messages, count))
    return row


def engine_rows(
    conversations: dict[str, list[Message]], questions: Sequence[Question], budget: int, tokenizer: Tokenizer, sessions: dict[str, Any], embedder: Any
) -> list[Row]:
    label = "engine (BM25 + dense)" if embedder is not None else "engine (BM25)"
    rows = [Row(f"{label}, {name}", []) for name in PROXY_ROWS]
    for q in questions:
        messages = conversations[q.conv_id]
        calls, _ = worker_calls(sessions[q.conv_id].pages.index(), q.text, budget, tokenizer.count_built, embedder)
        for row, outcome in zip(rows, proxy_outcomes(q, messages, calls, tokenizer.count, needles(q, messages))):
            row.outcomes.append(outcome)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["messages", "pairs", "locomo"], default="messages")
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--min-chars", type=int, default=20, help="a sentence shorter than this joins the next")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embeddings", action="store_true", help="dense recall on, as the proxy's default")
    parser.add_argument("--vectors", type=Path, default=None, help="keep the MiniLM vectors here between runs")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    tokenizer = Tokenizer(ENCODING)
    conversations, questions = load_data(args.data, [1, 2, 3, 4], None)
    conversations, questions = short_turn_data(conversations, questions, load_answers(args.data), args.shape, args.min_chars)
    sizes = [len(ms) for ms in conversations.values()]
    tokens = [sum(tokenizer.count(m["content"]) + 4 for m in ms) for ms in conversations.values()]
    print(
        f"LoCoMo {args.data.name} as {args.shape}: {len(conversations)} conversations of {min(sizes):,}–{max(sizes):,} messages ({sum(tokens) / sum(sizes):.1f} tokens a message, {min(tokens):,}–{max(tokens):,} a conversation), {len(questions)} questions ({category_counts(questions, [1, 2, 3, 4])})\n"
    )
    sessions = {conv_id: paged_session(messages, tokenizer.count) for conv_id, messages in conversations.items()}
    dense = DenseRanker()
    with steady_state(sessions, args.embeddings, args.vectors) as embedder:
        for budget in args.budgets:
            rows = [
                flat_dense(conversations, questions, budget, tokenizer.count, dense),
                *engine_rows(conversations, questions, budget, tokenizer, sessions, embedder),
            ]
            print(markdown_table(budget, rows, [1, 2, 3, 4]) + "\n")
    print(LEGEND)
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
