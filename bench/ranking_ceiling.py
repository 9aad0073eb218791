"""How far can ranking alone carry evidence recall? A model-free ceiling on LoCoMo.

For every question of the LoCoMo dev split (categories 1–4), a ranker orders the
conversation's turns (or its pages); walking down that order and adding each
unit's tokens, the question is recalled at T tokens when all its evidence turns
are in before T tokens are spent. No structure, overview or instructions are
paid for, so this is an upper bound for any prompt built on that ranking:

* turns cost what they cost as chat messages (``pcp_core.text.tokens.message_tokens``);
* pages are the proxy's own Original pages (``pcp_core.paging.history.page_history``),
  costing their content plus the XML of a Detail node in the ``<PagedContext>``.

Rankers: the proxy's Router itself (``pcp_core.ranking.router.broad_match``: pages
scored by BM25 with feedback, alone or with MiniLM — each page alone and read
with the one before —, plus a lift for pages said in a period the question
names, and a share of the better neighbour's score); BM25 with
pseudo-relevance feedback over turns; MiniLM cosine over turns, alone and read
with the turn before; and the two turn rankings fused by reciprocal rank
(k=30), where a turn gains 0.3 of its better neighbour's score, and a page
ranked by its best such turn.

A second table asks whether the Router's scores tell how deep to read: each
question takes the pages that stand out (score at least z standard deviations
above the conversation's mean), against every question given the same mean
tokens.

    .venv/bin/python bench/ranking_ceiling.py [--tokens 1500 1800 3500 7000] [--questions 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recall import CATEGORY_NAMES, DEFAULT_DATA, ENCODING, DenseRanker, Question, load_data  # noqa: E402
from pcp_core.pages.logical import Origin, OriginalPage, View  # noqa: E402
from pcp_core.paging.history import page_history, turns_from_messages  # noqa: E402
from pcp_core.prompt.markup import node_lines  # noqa: E402
from pcp_core.ranking.bm25 import Bm25  # noqa: E402
from pcp_core.ranking.router import anchor_intent, broad_match, broad_scores, dense_scores, dense_texts, lexical_scores, unit_texts  # noqa: E402
from pcp_core.text.tokens import message_tokens  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

RRF_K = 30
STAND_OUT = (2.0, 2.5, 3.0, 3.5)  # z-scores a page must reach to be taken, in the depth table
NOW = datetime(2026, 1, 1)  # when the questions are asked: after every conversation
NEIGHBOUR_SHARE = 0.3
Scores = dict[int, float]


def detail_node(page: OriginalPage) -> str:
    """A page as the proxy shows it in Detail, standing alone in the Linear_Flow."""
    return node_lines(page, View.DETAIL)


def tokens_until_all_in(units: Sequence[tuple[set[int], int]], evidence: set[int]) -> float:
    """Tokens spent, walking ``units`` (turns held, cost) in order, until every evidence turn is in."""
    missing, spent = set(evidence), 0
    for turns, cost in units:
        spent += cost
        missing -= turns
        if not missing:
            return spent
    return float("inf")


def rank_fusion(*orders: Sequence[int]) -> Scores:
    scores: Scores = {}
    for order in orders:
        for rank, turn in enumerate(order):
            scores[turn] = scores.get(turn, 0.0) + 1.0 / (RRF_K + rank + 1)
    return scores


def with_neighbours(scores: Scores) -> Scores:
    return {t: s + NEIGHBOUR_SHARE * max(scores.get(t - 1, 0.0), scores.get(t + 1, 0.0)) for t, s in scores.items()}


def ordered(scores: Scores, n: int) -> list[int]:
    """Turns by score; turns without one keep conversation order at the end."""
    ranked = sorted(scores, key=lambda t: -scores[t])
    seen = set(ranked)
    return ranked + [t for t in range(n) if t not in seen]


class Conversation:
    """One conversation's turns and pages, BM25 over both, and MiniLM vectors of both."""

    def __init__(self, messages: list[dict], dense: DenseRanker, count: Callable[[str], int]):
        self.n = len(messages)
        self.turn_cost = [message_tokens(m, count) for m in messages]
        turns = turns_from_messages(messages, "2023-01-01T00:00:00")
        self.pages = page_history(turns, count).leaves
        self.page_cost = [count(detail_node(p)) for p in self.pages]
        self.held = [set(range(p.first_turn, p.last_turn + 1)) for p in self.pages]  # the turns each page holds
        self.page_bm25 = Bm25(self.pages)
        as_pages = [
            OriginalPage(id=str(i), origin=Origin.HISTORY, depth=0, timestamp="", keywords=(), summary="", content=m["content"]) for i, m in enumerate(messages)
        ]
        self.turn_bm25 = Bm25(as_pages)
        contents = [m["content"] for m in messages]
        self.alone = dense.embed(contents)
        self.paired = dense.embed([f"{contents[i - 1]}\n{text}" if i else text for i, text in enumerate(contents)])
        # What the proxy's dense recall embeds (pcp_core.ranking.router.dense_texts): each page, alone and after the one before it.
        self.units = unit_texts(self.pages)
        self.unit_vectors = dense.embed(dense_texts(self.units))


def rankings(conv: Conversation, question_vector, text: str) -> dict[str, list[tuple[set[int], int]]]:
    intent = anchor_intent("", text, now=NOW)
    weights = intent.weights
    position = {p.id: i for i, p in enumerate(conv.pages)}

    def as_turns(order: Sequence[int]) -> list[tuple[set[int], int]]:
        return [({t}, conv.turn_cost[t]) for t in order]

    def as_pages(order: Sequence[int]) -> list[tuple[set[int], int]]:
        return [(conv.held[i], conv.page_cost[i]) for i in order]

    def by_best_turn(scores: Scores) -> list[int]:
        return sorted(range(len(conv.pages)), key=lambda i: -max(scores.get(t, 0.0) for t in conv.held[i]))

    page_order = ordered({position[p]: score for p, score in conv.page_bm25.rank_with_feedback(weights)}, len(conv.pages))
    bm25_turns = ordered({int(t): s for t, s in conv.turn_bm25.rank_with_feedback(weights)}, conv.n)
    alone = list((-(conv.alone @ question_vector)).argsort())
    paired = list((-(conv.paired @ question_vector)).argsort())
    fused = with_neighbours(rank_fusion(bm25_turns, paired))
    # The proxy's own Router (pcp_core.ranking.router): pages scored by BM25 and MiniLM z-scores.
    by_id = {p.id: i for i, p in enumerate(conv.pages)}
    lexical = lexical_scores(intent, conv.units)
    router = [by_id[p] for p in broad_match(intent, conv.pages, lexical)]
    router_dense = [by_id[p] for p in broad_match(intent, conv.pages, lexical, dense_scores(conv.unit_vectors @ question_vector, len(conv.units)))]
    return {
        "pages: the Router, BM25": as_pages(router + [i for i in range(len(conv.pages)) if i not in set(router)]),
        "pages: the Router, BM25 + MiniLM": as_pages(router_dense),
        "pages: BM25 + feedback, no neighbours or dates": as_pages(page_order),
        "turns: BM25 + feedback": as_turns(bm25_turns),
        "turns: MiniLM (flat dense)": as_turns(alone),
        "turns: MiniLM, read with the turn before": as_turns(paired),
        "turns: fused, neighbours": as_turns(ordered(fused, conv.n)),
        "pages: fused turns, a page by its best": as_pages(by_best_turn(fused)),
    }


def depth_walk(conv: Conversation, question_vector, text: str) -> tuple[list[float], list[tuple[set[int], int]]]:
    """The Router's (BM25 + MiniLM) pages best first as ``(turns held, cost)``, with each one's score in standard
    deviations of the conversation's pages (``pcp_core.ranking.router.broad_scores``)."""
    intent = anchor_intent("", text, now=NOW)
    dense = dense_scores(conv.unit_vectors @ question_vector, len(conv.units))
    score, _ = broad_scores(intent, conv.pages, lexical_scores(intent, conv.units), dense)
    order = sorted(range(len(conv.pages)), key=lambda i: -score[i])
    return [float(score[i]) for i in order], [(conv.held[i], conv.page_cost[i]) for i in order]


def depth_table(walks: Sequence[tuple[Question, list[float], list[tuple[set[int], int]]]]) -> None:
    """Pages taken while they stand out (score >= z, at least one) against the same mean tokens spent on every question."""
    print("\n| pages taken while their score stands out | recall | mean tokens | every question given those tokens |\n|---|---|---|---|")
    for z in STAND_OUT:
        recalled, spent = [], []
        for question, scores, units in walks:
            taken = units[: max(1, sum(s >= z for s in scores))]
            spent.append(sum(cost for _, cost in taken))
            recalled.append(tokens_until_all_in(taken, set(question.evidence)) < float("inf"))
        mean = sum(spent) / len(spent)
        fixed = sum(tokens_until_all_in(units, set(q.evidence)) <= mean for q, _, units in walks) / len(walks)
        print(f"| z >= {z} | {sum(recalled) / len(recalled):.2f} | {mean:,.0f} | {fixed:.2f} |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1500, 1800, 3500, 7000])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--encoder", choices=["minilm", "mpnet"], default="minilm", help="the dense model (fp32) of every ranking that uses one")
    parser.add_argument("--questions", type=int, default=None, help="the first N questions of each conversation (followups.py asks 30)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    count = Tokenizer(ENCODING).count
    conversations, questions = load_data(args.data, [1, 2, 3, 4], args.questions)
    dense = DenseRanker(args.encoder)
    convs = {cid: Conversation(messages, dense, count) for cid, messages in conversations.items()}
    vectors = dense.embed([q.text for q in questions])
    spent: dict[str, list[tuple[Question, float]]] = {}
    walks = []
    for question, vector in zip(questions, vectors):
        for name, units in rankings(convs[question.conv_id], vector, question.text).items():
            spent.setdefault(name, []).append((question, tokens_until_all_in(units, set(question.evidence))))
        walks.append((question, *depth_walk(convs[question.conv_id], vector, question.text)))

    print(f"LoCoMo {args.data.name}: {len(questions)} questions; share recalled within T tokens of the ranking\n")
    asked = {c: sum(q.category == c for q in questions) for c in (1, 2, 3, 4)}  # a category of few questions reads 0 or 1 by chance
    header = ["ranking", *(f"T={t:,}" for t in args.tokens), *(f"{CATEGORY_NAMES[c]} @{args.tokens[0]:,} (n={asked[c]})" for c in (1, 2, 3, 4))]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    label = {"minilm": "MiniLM", "mpnet": "mpnet"}[args.encoder]
    for name, rows in spent.items():
        name = name.replace("MiniLM", label)
        cells = [f"{sum(s <= t for _, s in rows) / len(rows):.2f}" for t in args.tokens]
        for category in (1, 2, 3, 4):
            mine = [s for q, s in rows if q.category == category]
            cells.append(f"{sum(s <= args.tokens[0] for s in mine) / len(mine):.2f}" if mine else "–")
        print(f"| {name} | " + " | ".join(cells) + " |")
    depth_table(walks)
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
