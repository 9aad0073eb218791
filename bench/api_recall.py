"""Evidence recall through each paged API: chat completions, OpenAI's Responses, Anthropic's Messages.

``bench/recall.py``'s proxy rows, with each LoCoMo question sent through the
API named: the same conversation and question as a chat completion
(``messages``), as a Responses request (``input`` items: the user's turns as
input messages, the assistant's as the output messages a client sends back)
and as a Messages request (``messages`` of text blocks). The simulated worker
(``bench/simulated_worker.py``) answers each worker call in the shape of the
API it came in, reading the ``<PagedContext>`` from where that API puts it
(chat's system message, Responses' ``instructions``, Messages' ``system``).
A worker call is then read back as the chat messages it amounts to, so its
prompt is counted and searched for the evidence as ``recall.py`` does. One
rule book pages all three: their figures should differ by noise at most.

    .venv/bin/python bench/api_recall.py [--budgets 2048 4096] [--apis chat responses messages] [--limit N] [--embeddings]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recall import DEFAULT_DATA, ENCODING, LEGEND, Message, Question, category_counts, load_data, load_worker, markdown_table, run_proxy  # noqa: E402
from proxy.testing.apis import PATHS  # noqa: E402
from proxy.tokenizer import Tokenizer  # noqa: E402

APIS = tuple(PATHS)


def request_body(api: str, messages: Sequence[Message]) -> dict[str, Any]:
    """The conversation as a request of ``api``."""
    if api == "responses":
        return {"model": "sim", "input": [_item(m) for m in messages]}
    if api == "messages":
        return {"model": "sim", "max_tokens": 256, "messages": [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in messages]}
    return {"model": "sim", "messages": list(messages)}


def _item(message: Message) -> dict[str, Any]:
    if message["role"] == "assistant":
        return {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
        }
    return {"role": message["role"], "content": [{"type": "input_text", "text": message["content"]}]}


def as_chat(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """A worker call of ``api`` as the chat messages it amounts to: the <PagedContext> first, then the user line."""
    if api == "chat":
        return body
    system = body.get("instructions") if api == "responses" else body.get("system")
    if isinstance(system, list):
        system = "".join(block["text"] for block in system)
    rest = body["input"] if api == "responses" else body["messages"]
    head = [{"role": "system", "content": system}] if system else []
    return {"messages": [*head, *({"role": m["role"], "content": _text(m["content"])} for m in rest)]}


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content if isinstance(part, dict))


def asker(api: str) -> Callable[..., tuple[Any, list[dict[str, Any]]]]:
    """``recall.ask_proxy`` for ``api``: POST one question, return the response and its worker calls as chat."""

    def ask(
        client: Any, url: str, fake: Any, messages: list[Message], question: Question, compose: Callable[..., list[Message]]
    ) -> tuple[Any, list[dict[str, Any]]]:
        start = len(fake.requests)
        response = client.post(f"{url}/v1{PATHS[api]}", json=request_body(api, compose(messages, question)))
        calls = [as_chat(api, r.json) for r in fake.requests[start:] if r.headers.get("x-pcp-role") == "worker"]
        return response, calls

    return ask


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--apis", nargs="+", choices=APIS, default=list(APIS))
    parser.add_argument("--limit", type=int, default=None, help="at most N questions per conversation")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embeddings", action="store_true", help="dense recall on (the proxy's default)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    count = Tokenizer(ENCODING).count
    conversations, questions = load_data(args.data, [1, 2, 3, 4], args.limit)
    print(
        f"LoCoMo {args.data.name}: {len(conversations)} conversations, {len(questions)} questions ({category_counts(questions, [1, 2, 3, 4])}); one proxy per API\n"
    )
    worker = load_worker("flow")
    for budget in args.budgets:
        rows, notes = [], []
        for api in args.apis:
            more, stats = run_proxy(conversations, questions, budget, count, worker, args.embeddings, label=f"{api}", ask=asker(api))
            rows += more
            notes.append(f"{api}: {stats.summary(budget, sum(o.max_prompt > budget for o in more[1].outcomes))}")
        print(markdown_table(budget, rows, [1, 2, 3, 4]))
        print("\n" + "\n".join(notes) + "\n")
    print(LEGEND)
    print(f"\ntotal {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
