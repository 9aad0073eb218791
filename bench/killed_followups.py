"""A paged chat survives ``kill -9`` during its follow-up: the next request continues the same session.

A real proxy process (``python -m proxy serve``, the embedded store in a
temporary PCP_DATA_DIR, a low threshold and budget so that every chat is
paged) in front of a fake upstream on loopback that answers each call after
50–300 ms. Four chats are established, each a LoCoMo conversation
(~20k tokens) and a first question. Then, ``--kills`` times: one chat's
follow-up (its history, the previous answer, a new question) is sent, the
proxy is killed with SIGKILL 0–1.5 s after it (``--max-delay``; with
``--on-answer``, that long after its answer arrives, while the session is
being written), and started again on the same data directory; the chat's
follow-up is sent again as the client has the
conversation (the same request if the killed one never answered, the next
one if it did). Recorded: whether that answer's ``x-pcp-session`` is the
chat's session (the id of its earlier answers) or a new one, whether
``GET /v1/pcp/sessions`` still lists the chat's session, and any 5xx.

    .venv/bin/python bench/killed_followups.py [--kills 12] [--max-delay 1.5] [--on-answer] [--checkout /path/to/another/checkout]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.proxy_overhead import free_port, proxy_env, start_proxy, wait_until_up  # noqa: E402
from proxy.testing.apis import default_reply  # noqa: E402
from proxy.testing.upstream import FakeUpstream, Recorded, Reply  # noqa: E402

LOCOMO = Path("/work/shared/data/locomo-dev/conversations.jsonl")
AUTH = {"authorization": "Bearer sk-killed-followups"}
CHATS = 4


@dataclasses.dataclass
class Chat:
    name: str
    messages: list[dict[str, str]]  # the conversation as the client has it, up to the last answer
    session: str = ""  # the id of its last answer
    asked: int = 0


@dataclasses.dataclass
class Sent:
    status: int | None = None
    session: str = ""
    answer: str = ""
    error: str = ""
    mode: str = ""
    seconds: float = 0.0


def slow_upstream(rng: random.Random) -> FakeUpstream:
    """Answers every call in kind ("ok"), after 50-300 ms."""

    def reply(recorded: Recorded) -> Reply:
        return dataclasses.replace(default_reply(recorded), delay=rng.uniform(0.05, 0.3))

    return FakeUpstream(default=reply).start()


def histories() -> list[list[dict[str, str]]]:
    rows = [json.loads(line) for line in LOCOMO.read_text().splitlines() if line.strip()]
    return [[{"role": m["role"], "content": m["content"]} for m in row["messages"]] for row in rows[:CHATS]]


def question(chat: Chat) -> dict[str, str]:
    chat.asked += 1
    return {"role": "user", "content": f"Question {chat.asked}: what did we say about the plans mentioned in session {chat.asked}?"}


def send(url: str, messages: list[dict[str, str]], timeout: float = 120) -> Sent:
    start = time.monotonic()
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "fake-model", "messages": messages}, headers=AUTH, timeout=timeout)
    except httpx.HTTPError as e:
        return Sent(error=type(e).__name__)
    answer = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
    return Sent(r.status_code, r.headers.get("x-pcp-session", ""), answer, mode=r.headers.get("x-pcp-mode", ""), seconds=time.monotonic() - start)


def listed(url: str) -> dict[str, int]:
    """The caller's sessions the proxy lists, with the messages each holds."""
    r = httpx.get(f"{url}/v1/pcp/sessions", headers=AUTH, timeout=60)
    r.raise_for_status()
    return {s["id"]: s["messages"] for s in r.json()["data"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-delay", type=float, default=1.5, help="the kill comes 0 to this many seconds after the follow-up is sent")
    parser.add_argument("--on-answer", action="store_true", help="the kill comes 0 to --max-delay seconds after the answer arrives (the session's write)")
    parser.add_argument("--checkout", type=Path, default=None, help="the proxy from another checkout (its code, run from its directory)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    data = tempfile.mkdtemp(prefix="pcp-killed-followups-")
    upstream = slow_upstream(random.Random(args.seed + 1))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = proxy_env(data_dir=data, sentry_threshold=2000, context_budget=1024, router_embeddings=False, log_level="warning")
    env["HF_HUB_OFFLINE"] = "1"
    if args.checkout:
        env["PYTHONPATH"] = str(args.checkout)
    cwd = args.checkout or REPO

    def up() -> subprocess.Popen:
        proc = start_proxy(upstream.url, port, env, cwd)
        wait_until_up(port, "/healthz")
        return proc

    proxy = up()
    chats = [Chat(f"chat {i + 1}", h) for i, h in enumerate(histories())]
    fivexx = 0
    for chat in chats:
        asked = [*chat.messages, question(chat)]
        sent = send(url, asked)
        if sent.status != 200 or not sent.session or sent.mode != "protocol":
            raise SystemExit(f"{chat.name}: the first paged request answered {sent.status} {sent.error}, mode {sent.mode!r}, session {sent.session!r}")
        chat.messages, chat.session = [*asked, {"role": "assistant", "content": sent.answer}], sent.session
    print(f"{CHATS} chats established: {', '.join(f'{c.name} {c.session}' for c in chats)}", flush=True)

    rows: list[tuple[str, float, str, str]] = []
    changed: set[str] = set()
    unlisted = 0
    try:
        for kill in range(args.kills):
            chat = rng.choice(chats)
            asked = [*chat.messages, question(chat)]
            whole = len(chat.messages)  # what the store holds of the chat once the follow-up is written (all but the last question)
            killed = Sent()
            answered = threading.Event()

            def follow_up(asked: list[dict[str, str]] = asked, killed: Sent = killed, answered: threading.Event = answered) -> None:
                killed.__dict__.update(send(url, asked).__dict__)
                answered.set()

            thread = threading.Thread(target=follow_up)
            delay = rng.uniform(0.0, args.max_delay)
            thread.start()
            if args.on_answer:
                answered.wait(30)
            time.sleep(delay)
            proxy.send_signal(signal.SIGKILL)
            proxy.wait()
            thread.join()
            notes = []
            if killed.status is not None:
                fivexx += killed.status >= 500
                notes.append(f"answered {killed.status} ({killed.mode}) {killed.seconds:.2f} s in, before the kill")
            if killed.status == 200:  # the client has the answer: its next turn goes on from it
                if killed.session != chat.session:
                    notes.append(f"in new session {killed.session}")
                    changed.add(chat.name)
                chat.messages, chat.session = [*asked, {"role": "assistant", "content": killed.answer}], killed.session or chat.session
                asked = [*chat.messages, question(chat)]
            proxy = up()
            held = listed(url).get(chat.session)  # before the follow-up is sent again: what the store kept
            if held is None:
                unlisted += 1
                notes.append(f"{chat.session} not listed after the restart")
            else:
                notes.append(
                    "the killed follow-up stored"
                    if held == whole
                    else "the turn before it stored"
                    if held == whole - 2
                    else f"{held} messages stored (whole: {whole})"
                )
            after = send(url, asked)
            if after.status is None or after.status >= 500:
                fivexx += after.status is not None
                outcome = f"error {after.status or after.error}"
            elif after.session == chat.session:
                outcome = "same session"
            else:
                outcome = f"changed session ({chat.session} → {after.session})"
                changed.add(chat.name)
            if chat.session not in listed(url):
                unlisted += held is not None
                notes.append(f"{chat.session} not listed after the follow-up")
            if after.status == 200:
                chat.messages = [*asked, {"role": "assistant", "content": after.answer}]
                chat.session = after.session or chat.session
            rows.append((chat.name, delay, outcome, "; ".join(notes)))
            print(f"kill {kill + 1}: {chat.name}, {delay:.2f} s, {outcome} {'; '.join(notes)}", flush=True)
    finally:
        proxy.terminate()
        proxy.wait()
        upstream.stop()

    when = f"0–{args.max_delay} s after {'the answer' if args.on_answer else 'the follow-up was sent'}"
    print(f"\nkilled {when}, {'code in ' + str(args.checkout) if args.checkout else 'this checkout'}")
    print(
        f"\n| kills | chats that changed session | sessions no longer listed | 5xx |\n|---:|---:|---:|---:|\n| {args.kills} | {len(changed)} of {CHATS} | {unlisted} | {fivexx} |"
    )
    print("\n| kill | chat | delay | outcome | notes |\n|---:|---|---:|---|---|")
    for i, (name, delay, outcome, notes) in enumerate(rows, 1):
        print(f"| {i} | {name} | {delay:.2f} s | {outcome} | {notes} |")


if __name__ == "__main__":
    main()
