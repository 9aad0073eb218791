"""A chat's follow-ups as a new user meets them: what round 0 shows, how many calls, what it is billed.

Each LoCoMo conversation is one chat: its history, then ``--questions`` of its
questions asked in a row (each earlier one with its answer in the messages),
through the real proxy at its defaults but the budget. The worker Consults
until it finds the evidence: it answers as soon as a prompt holds every
evidence turn, and otherwise Consults as ``bench/simulated_worker.py`` does
(answering when nothing is left to Consult, or in the final round).

Per budget and API it prints:

* round 0: the share of questions whose first prompt holds all the evidence,
  what a model that answers from what it sees answers from;
* ≤ 3 Consults, the answering prompt: within the request's calls, in the
  prompt the worker answered from;
* calls a request, and the seconds to the answer (the proxy and this worker;
  a real model's time comes on top, once a call);
* the input billed over all the chat's calls (its first request included)
  ÷ the same chat sent untouched to a prefix-caching provider, in two rules:

  - *OpenAI's*: a prompt's longest prefix seen in an earlier call (of the
    chat's last 16) is read at 0.1, from 1,024 tokens in steps of 128;
    untouched, each request reads the one before it;
  - *Anthropic's* (``--api messages``, ``proxy.testing.prompt_cache``): an
    entry is written where a ``cache_control`` mark is, from ``--floor``
    tokens, at 1.25; read at 0.1; the rest at 1. Untouched, the client marks
    its last message: each request reads the one before it and writes what
    it adds.

The prompt's head (the proxy's instructions; no client system prompt in
LoCoMo) is billed both ways. Dev figures: the design was read off this data.

    .venv/bin/python bench/followups.py [--budgets 2048 4096] [--questions 30] [--api chat messages]
                                        [--floor 1024] [--embeddings] [--cached-price 0.1] [--conversations N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.prefix_cache import compose, shared_prefix  # noqa: E402
from bench.recall import DEFAULT_DATA, ENCODING, Message, evidence_texts, load_data, running_proxy  # noqa: E402
from bench.simulated_worker import ANSWER, choose_consult, content_texts, parse_prompt, simulated_worker  # noqa: E402
from pcp_core.billing import billed, cached  # noqa: E402
from pcp_core.text.tokens import prompt_tokens  # noqa: E402
from proxy.settings import CHAT_BUDGET  # noqa: E402
from proxy.testing.apis import answer, api_of, worker_document  # noqa: E402
from proxy.testing.upstream import Recorded, Reply  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

READ, WRITE = 0.1, 1.25  # a cached token read, and written (Anthropic), against an uncached one
LOOKBACK = 16  # earlier calls a provider's cache may still hold a prefix of


class Finder:
    """The worker that Consults until it finds the evidence of the question being asked (``needles``)."""

    def __init__(self) -> None:
        self.needles: list[str] = []

    def __call__(self, recorded: Recorded) -> Reply:
        if recorded.headers.get("x-pcp-role") != "worker":
            return simulated_worker(recorded)
        document = worker_document(recorded)
        content = "\n".join(content_texts(document))
        if all(n in content for n in self.needles) or choose_consult(parse_prompt(document)) is None:
            return answer(api_of(recorded), ANSWER)
        return simulated_worker(recorded)


@dataclass
class Chat:
    """One chat's requests: per request its worker prompts (as token counts and what a cache reads), and outcomes."""

    paged: float = 0.0
    untouched: float = 0.0
    calls: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    round0: list[bool] = field(default_factory=list)
    within: list[bool] = field(default_factory=list)
    answering: list[bool] = field(default_factory=list)


def holds(content: str, needles: Sequence[str]) -> bool:
    return all(n in content for n in needles)


def untouched_bill(sizes: Sequence[int], api: str, floor: int) -> float:
    """The chat's requests sent untouched, each ``sizes[i]`` tokens, each a prefix of the next."""
    total, before = 0.0, 0
    for size in sizes:
        if api == "chat":
            total += billed(size, cached(before), READ)
        else:  # the client's mark on its last message: read the request before, write what this one adds
            read = before if before >= floor else 0
            total += READ * read + (WRITE if size >= floor else 1) * (size - read)
        before = size
    return total


def ask(client: Any, url: str, api: str, messages: list[Message]) -> tuple[int, str, float]:
    start = time.perf_counter()
    if api == "chat":
        response = client.post(f"{url}/v1/chat/completions", json={"model": "sim", "messages": messages})
        text = response.json()["choices"][0]["message"]["content"] if response.status_code == 200 else ""
    else:
        response = client.post(f"{url}/v1/messages", json={"model": "sim", "max_tokens": 256, "messages": messages})
        text = response.json()["content"][0]["text"] if response.status_code == 200 else ""
    return response.status_code, text, time.perf_counter() - start


def measure(
    budget: int, api: str, questions_per_chat: int, conversations_at_most: int | None, data: Path, floor: int, embeddings: bool, **settings: Any
) -> list[Chat]:
    import httpx

    from proxy.testing.prompt_cache import PromptCache
    from proxy.testing.upstream import EMBEDDING_DONE, wait_for_background

    count = Tokenizer(ENCODING).count
    conversations, questions = load_data(data, [1, 2, 3, 4], questions_per_chat)
    chosen = list(conversations)[:conversations_at_most] if conversations_at_most else list(conversations)
    finder = Finder()
    cache = PromptCache(count, min_tokens=floor, lookback=20)
    worker: Callable[[Recorded], Reply] = cache.replying(finder) if api == "messages" else finder
    chats: dict[str, Chat] = {}
    earlier: dict[str, list[str]] = {}  # each chat's worker prompts so far, as text (OpenAI's rule)
    asked: dict[str, list[tuple[str, str]]] = {}
    sizes: dict[str, list[int]] = {}
    # The default budget is left unset, as a new user leaves it: the proxy's own, with a frame on top (a set one is the cap).
    with running_proxy(0 if budget == CHAT_BUDGET else budget, worker, embeddings, **settings) as (fake, url), httpx.Client(timeout=600) as client:
        for question in questions:
            conv = question.conv_id
            if conv not in chosen:
                continue
            chat = chats.setdefault(conv, Chat())
            messages = compose(conversations[conv], asked.setdefault(conv, []), question.text, "chat")
            finder.needles = needles = evidence_texts(question, conversations[conv])
            start, used = len(fake.requests), len(cache.calls)
            status, text, seconds = ask(client, url, api, messages)
            calls = [r for r in fake.requests[start:] if r.headers.get("x-pcp-role") == "worker"]
            if status != 200 or not calls:
                print(f"  {conv} q{question.qa_idx}: status {status}, {len(calls)} worker calls", file=sys.stderr)
                continue
            sizes.setdefault(conv, []).append(prompt_tokens(messages, count))
            contents = ["\n".join(content_texts(worker_document(call))) for call in calls]
            chat.round0.append(holds(contents[0], needles))
            chat.within.append(all(any(n in c for c in contents) for n in needles))
            chat.answering.append(holds(contents[-1], needles))
            chat.calls.append(len(calls))
            chat.seconds.append(seconds)
            if api == "chat":
                chat.paged += _openai_bill(calls, earlier.setdefault(conv, []), count)
            else:
                usage = cache.calls[used:]
                chat.paged += sum(u["input_tokens"] + READ * u["cache_read_input_tokens"] + WRITE * u["cache_creation_input_tokens"] for u in usage)
            asked[conv].append((question.text, text))
            if embeddings and len(asked[conv]) == 1:  # the history is encoded in the background: a user's next question comes after
                wait_for_background(lambda: client.get(f"{url}/metrics").text, "pcp_texts_embedded_total", EMBEDDING_DONE)
    for conv, chat in chats.items():
        chat.untouched = untouched_bill(sizes[conv], api, floor)
    return list(chats.values())


def _openai_bill(calls: Sequence[Recorded], earlier: list[Any], count: Callable[[str], int]) -> float:
    """The calls' input billed by OpenAI's rule, each against the longest prefix of the chat's recent calls."""
    total = 0.0
    for call in calls:
        messages = call.json["messages"]
        shared = max((shared_prefix(before, messages, count) for before in earlier[-LOOKBACK:]), default=0)
        total += billed(prompt_tokens(messages, count), cached(shared), READ)
        earlier.append(messages)
    return total


def row(budget: int, api: str, chats: Sequence[Chat]) -> str:
    flat = lambda name: [x for chat in chats for x in getattr(chat, name)]  # noqa: E731
    ratio = sum(chat.paged for chat in chats) / sum(chat.untouched for chat in chats)
    each = ", ".join(f"{chat.paged / chat.untouched:.2f}" for chat in chats)
    cells = [
        f"{budget:,}",
        api,
        f"{len(flat('round0'))}",
        f"**{statistics.fmean(flat('round0')):.3f}**",
        f"{statistics.fmean(flat('within')):.3f}",
        f"{statistics.fmean(flat('answering')):.3f}",
        f"{statistics.fmean(flat('calls')):.2f}",
        f"{statistics.median(flat('seconds')) * 1000:,.0f}",
        f"**{ratio:.2f}×** ({each})",
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[4096])
    parser.add_argument("--api", nargs="+", choices=["chat", "messages"], default=["chat", "messages"])
    parser.add_argument("--questions", type=int, default=30, help="questions asked in a row, a chat")
    parser.add_argument("--conversations", type=int, default=None)
    parser.add_argument("--floor", type=int, default=1024, help="Anthropic's shortest cached prefix (1,024–4,096 by model)")
    parser.add_argument("--embeddings", action="store_true", help="dense recall beside BM25 (the proxy's default)")
    parser.add_argument("--cached-price", type=float, default=None, help="PCP_CACHED_INPUT_PRICE (1: every request ranked afresh)")
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="other settings (by their TOML names)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args(argv)
    settings: dict[str, Any] = {"cached_input_price": args.cached_price} if args.cached_price is not None else {}
    settings.update((name, float(value) if "." in value else int(value)) for name, value in (item.split("=", 1) for item in args.set))
    print(
        f"LoCoMo {args.data.name}, {args.questions} questions a chat in a row, {'dense + BM25' if args.embeddings else 'BM25'}, Anthropic floor {args.floor:,}\n"
    )
    header = [
        "budget",
        "API",
        "questions",
        "round 0",
        "≤ 3 Consults",
        "answering prompt",
        "calls a request",
        "ms to the answer (p50)",
        "billed ÷ untouched (each chat)",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for budget in args.budgets:
        for api in args.api:
            chats = measure(budget, api, args.questions, args.conversations, args.data, args.floor, args.embeddings, **settings)
            print(row(budget, api, chats), flush=True)


if __name__ == "__main__":
    main()
