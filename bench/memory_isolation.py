"""Memory's walls and its forgetting, counted on LoCoMo: what one key remembers, another never sees; what is forgotten never comes back.

Through the real proxy (in process, on loopback) in front of the simulated worker:

* **isolation** — key A sends each session of every LoCoMo dev conversation
  as its own conversation in scope ``<conversation>``; key B then uses the
  same scope names: it lists the scopes' pages, searches them with every
  question, and asks every question in them. Counted: pages of A's that B's
  listing, search or worker prompts show (by id, and by text);
* **forgetting** — for each conversation, the evidence turns of 20 of its
  questions are forgotten (``POST …/forget`` with each turn's words as the
  query), then every session is sent again, as a client would resend old
  conversations; the questions are asked again. Counted: forgotten turns
  whose text is in any page of the scope (export), or in a worker prompt.

    .venv/bin/python bench/memory_isolation.py
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.memory_recall import remember, sessions_of  # noqa: E402
from bench.recall import DEFAULT_DATA, load_data, running_proxy  # noqa: E402
from bench.simulated_worker import simulated_worker  # noqa: E402
from pcp_core.prompt.markup import xml_safe  # noqa: E402
from proxy.testing.apis import worker_document  # noqa: E402

A, B = {"authorization": "Bearer sk-key-a"}, {"authorization": "Bearer sk-key-b"}
FORGOTTEN_PER_CONVERSATION = 20


def worker_prompts(fake: Any, since: int) -> str:
    return "\n".join(worker_document(r) for r in fake.requests[since:] if r.headers.get("x-pcp-role") == "worker")


def ask(client: httpx.Client, url: str, scope: str, text: str, key: dict[str, str]) -> httpx.Response:
    return client.post(
        f"{url}/v1/chat/completions", json={"model": "sim", "messages": [{"role": "user", "content": text}]}, headers={**key, "x-pcp-memory": scope}
    )


def exported(client: httpx.Client, url: str, scope: str, key: dict[str, str]) -> str:
    return client.get(f"{url}/v1/pcp/memory/{scope}/export", headers=key).text


def main() -> None:
    started = time.perf_counter()
    conversations, questions = load_data(DEFAULT_DATA, [1, 2, 3, 4], None)
    rng = random.Random(22)
    with running_proxy(2048, simulated_worker, False) as (fake, url), httpx.Client(timeout=120, headers=A) as client:
        for conv_id, messages in conversations.items():
            remember(client, url, conv_id, messages)
        held = {conv_id: {json.loads(line)["id"] for line in exported(client, url, conv_id, A).splitlines()} for conv_id in conversations}
        print(f"key A: {sum(map(len, held.values())):,} pages in {len(held)} scopes")

        seen_ids = seen_texts = 0
        for conv_id in conversations:
            listing = client.get(f"{url}/v1/pcp/memory/{conv_id}/pages", params={"limit": 200}, headers=B).json()["data"]
            seen_ids += sum(p["id"] in held[conv_id] for p in listing) + len(exported(client, url, conv_id, B).splitlines())
        for question in questions:
            found = client.get(f"{url}/v1/pcp/memory/{question.conv_id}/pages", params={"query": question.text}, headers=B).json()["data"]
            seen_ids += sum(p["id"] in held[question.conv_id] for p in found)
            since = len(fake.requests)
            ask(client, url, question.conv_id, question.text, B)
            prompts = worker_prompts(fake, since) + json.dumps(fake.requests[-1].json)
            seen_texts += sum(xml_safe(conversations[question.conv_id][i]["content"]) in prompts for i in question.evidence)
        print(
            f"isolation: {len(questions)} questions asked and searched by key B in key A's scope names: {seen_ids} of A's pages listed or found, {seen_texts} of A's evidence turns in B's prompts"
        )

        forgotten: dict[str, list[str]] = {}
        for conv_id, messages in conversations.items():
            chosen = rng.sample([q for q in questions if q.conv_id == conv_id], FORGOTTEN_PER_CONVERSATION)
            turns = sorted({i for q in chosen for i in q.evidence})
            forgotten[conv_id] = [messages[i]["content"] for i in turns]
            for text in forgotten[conv_id]:
                client.post(f"{url}/v1/pcp/memory/{conv_id}/forget", json={"query": text}).raise_for_status()
        for conv_id, messages in conversations.items():
            for session in sessions_of(messages):  # the old conversations, sent again
                client.post(f"{url}/v1/chat/completions", json={"model": "sim", "messages": session}, headers={"x-pcp-memory": conv_id})
        while any(client.get(f"{url}/v1/pcp/memory/{c}").json()["pending"] for c in conversations):
            time.sleep(0.05)
        back_in_pages = sum(xml_safe(text) in exported(client, url, conv_id, A) for conv_id, texts in forgotten.items() for text in texts)
        since = len(fake.requests)
        for question in questions:
            ask(client, url, question.conv_id, question.text, A)
        prompts = worker_prompts(fake, since)
        back_in_prompts = sum(xml_safe(text) in prompts for texts in forgotten.values() for text in texts)
        total = sum(map(len, forgotten.values()))
        print(
            f"forgetting: {total} turns forgotten, every session sent again: {back_in_pages} back in memory's pages, {back_in_prompts} in the worker prompts of {len(questions)} questions"
        )
    print(f"{time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
