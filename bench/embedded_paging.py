"""The embedded default in protocol mode, measured: a long chat and a question through `make run`'s proxy.

Starts ``pcp-proxy serve`` with no upstream (SmolLM2-135M-Instruct on llama-server, every
setting at its default) or uses ``--url``, sends each of the first ``--conversations`` LoCoMo
dev conversations (13k-26k tokens, over the embedded slot's window) with ``--questions``
of its questions, and prints per request: the mode, seconds to the whole answer,
finish_reason, completion tokens, x-pcp-rounds, and whether the answer names any of the
protocol's scaffolding (``pcp_core.prompt.scaffolding.VOCABULARY``, ``<Node``, a directive call).

    .venv/bin/python bench/embedded_paging.py [--url http://127.0.0.1:8000] [--conversations 2] [--questions 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from pcp_core.prompt.scaffolding import VOCABULARY

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo-dev"
SCAFFOLDING = re.compile("|".join([*map(re.escape, VOCABULARY), r"<\s*/?\s*Node\b", r"\b(?:Consult|Explore|Shelve)\s*\("]))


def conversations(limit: int, questions: int) -> list[tuple[list[dict], list[str]]]:
    asked: dict[str, list[str]] = {}
    for line in (DATA / "questions.jsonl").read_text().splitlines():
        question = json.loads(line)
        asked.setdefault(question["conv_id"], []).append(question["question"])
    chats = [json.loads(line) for line in (DATA / "conversations.jsonl").read_text().splitlines()[:limit]]
    return [(chat["messages"], asked[chat["conv_id"]][:questions]) for chat in chats]


def serve(port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PCP_")}
    env.update(PCP_PORT=str(port), PCP_DATA_DIR=tempfile.mkdtemp(prefix="pcp-embedded-"), PCP_LOG_LEVEL="warning")
    return subprocess.Popen([sys.executable, "-m", "proxy", "serve"], env=env)


def ready(url: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the proxy at {url} is not ready after {seconds:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="")
    parser.add_argument("--port", type=int, default=18250)
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--questions", type=int, default=3)
    args = parser.parse_args()
    server = None if args.url else serve(args.port)
    url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        ready(url)
        print(
            "| conversation | messages | mode | seconds | of them the worker's | prompt tokens sent | finish | completion tokens | rounds | scaffolding in the answer | answer |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for number, (messages, questions) in enumerate(conversations(args.conversations, args.questions)):
            for question in questions:
                body = {"model": "smollm2-135m", "messages": [*messages, {"role": "user", "content": question}]}
                started = time.perf_counter()
                response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
                seconds = time.perf_counter() - started
                if response.status_code != 200:
                    print(
                        f"| {number} | {len(messages)} | {response.headers.get('x-pcp-mode')} | {seconds:.1f} | {response.status_code} | | | | {response.text[:80]} |"
                    )
                    continue
                reply = response.json()
                text = reply["choices"][0]["message"].get("content") or ""
                found = sorted(set(SCAFFOLDING.findall(text)))
                trace = httpx.get(f"{url}/v1/pcp/requests/{response.headers.get('x-pcp-trace')}", timeout=10)
                rounds = trace.json().get("rounds", []) if trace.status_code == 200 else []
                worker = sum(r.get("seconds", 0) for r in rounds)
                sent = "+".join(str(r.get("tokens", 0)) for r in rounds)
                shown = " ".join(text.split())[:80].replace("|", "/")
                print(
                    f"| {number} | {len(messages)} | {response.headers.get('x-pcp-mode')} | {seconds:.1f} | {worker:.1f} | {sent} | {reply['choices'][0]['finish_reason']} "
                    f"| {reply.get('usage', {}).get('completion_tokens')} | {response.headers.get('x-pcp-rounds')} | {', '.join(found) or 'none'} | {shown} |",
                    flush=True,
                )
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
