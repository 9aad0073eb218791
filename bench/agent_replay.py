"""A coding agent's session replayed through the proxy: per step, the request, its mode and rounds, its tokens and its cache-priced cost.

A session is recorded once per agent (``--record``; the agents come from
``make agents``): the agent runs the scripted task (``proxy.testing.agent_task``:
read a file, run a command that prints ~6k tokens of notes, edit, run the
tests, answer) directly against the scripted upstream, which keeps every
request as the agent sent it, in ``bench/results/agent-sessions/<agent>.jsonl``.

The replay sends those requests in order, as they were sent (path, query,
headers, body), to the proxy (in process, on loopback) in front of the same
scripted upstream, and prices, with ``bench/cost_replay.py``'s pricing (a
prefix shared with any earlier call, from 1,024 tokens in 128-token steps,
billed at 0.1 of an uncached token) and its rendering of a call (tools first,
then each message or item):

* *direct*: each request as the agent sent it, in a cache of its own (the
  agent without the proxy);
* *proxy*: every upstream call the request made (one per worker round; a
  forwarded request's one), in a cache of their own.

Per step: what the agent asked for (the scripted upstream's step: read, grep,
edit, test, answer; "side" for a title or a commit message; marked when the
step read from what the proxy sent differs from the one the request itself
asks for: the worker did not see the latest result), the proxy's mode
and rounds, the prompt tokens the proxy counted (``x-pcp-prompt-tokens``, tools
included), the tokens the upstream read directly and through the proxy, and
what each is billed. The replay is the proxy's: the requests are the agent's
own, whatever the proxy answered (the answers feed nothing back).

    .venv/bin/python bench/agent_replay.py [--record] [--agents claude,codex,opencode,aider]
                                           [--threshold 8192] [--budget 40000] [--window 0] [--sessions DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.cost_replay import ENCODING, PrefixCache, Renderer, selftest  # noqa: E402  the pricing, reused

SESSIONS = REPO / "bench" / "results" / "agent-sessions"
AGENTS = ("claude", "codex", "opencode", "aider")
API_PATHS = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}
NOT_SENT = frozenset({"host", "content-length", "connection", "transfer-encoding", "accept-encoding"})


# -- recording a session -----------------------------------------------------------------------


def record(agent: str, path: Path) -> None:
    """``agent`` through the task, directly against the scripted upstream: every request it sent, as JSON lines."""
    from proxy.testing.agent_upstream import AgentScript
    from proxy.testing.upstream import FakeUpstream
    from tests.proxy.agents.agents import installed, missing, run_agent

    if not installed(agent):
        raise SystemExit(missing(agent))
    with tempfile.TemporaryDirectory(prefix=f"pcp-agent-{agent}-") as run, FakeUpstream(AgentScript(big=True)) as upstream:
        done = run_agent(agent, upstream.url.removesuffix("/v1"), Path(run))
    if not done.done:
        raise SystemExit(f"the recording failed: {done.summary()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for r in upstream.requests:
            out.write(json.dumps({"method": r.method, "path": r.path, "query": r.query, "headers": r.headers, "body": r.body.decode()}) + "\n")
    print(f"recorded {agent}: {len(upstream.requests)} requests in {done.seconds:.1f} s -> {path}", file=sys.stderr)


# -- replaying it ------------------------------------------------------------------------------


def render(renderer: Renderer, api: str, body: dict[str, Any]) -> Any:
    """A call's tokens as a provider lays them out: tools first, then the system text and each message or item."""
    if api == "chat":
        said = body.get("messages") or []
    elif api == "responses":
        items = body.get("input")
        said = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
        said += items if isinstance(items, list) else [{"role": "user", "content": items}]
    else:
        said = [{"role": "system", "content": body["system"]}] if body.get("system") else []
        said += body.get("messages") or []
    return renderer.call(said, body.get("tools"))


@dataclass
class Step:
    asked: str  # the scripted upstream's step: read, grep, edit, test, answer, side
    kept: bool  # the step read from what the proxy sent is the one the request itself asks for
    api: str
    mode: str
    rounds: int
    counted: int  # x-pcp-prompt-tokens
    direct_tokens: int
    proxy_tokens: int
    direct_billed: float
    proxy_billed: float


@contextmanager
def running_proxy(threshold: int, budget: int, window: int) -> Iterator[tuple[Any, Any, str]]:
    """The proxy on loopback in front of the scripted upstream (in process): (the upstream, its script, the proxy's URL)."""
    from proxy.app import create_app
    from proxy.cli.server import server_options
    from proxy.settings import Settings
    from proxy.testing.agent_upstream import AgentScript
    from proxy.testing.upstream import FakeUpstream, serve_in_thread

    script = AgentScript(big=True)
    fake = FakeUpstream(script)
    with tempfile.TemporaryDirectory(prefix="pcp-agent-replay-") as data:
        settings = Settings(
            upstream_base_url=fake.url,
            data_dir=data,
            router_embeddings=False,
            sentry_threshold=threshold,
            context_budget=budget,
            context_window=window,
            log_level="warning",
        )
        server = serve_in_thread(create_app(settings, transport=fake.transport()), **server_options(settings))
        try:
            yield fake, script, server.url
        finally:
            server.stop()


def replay(requests: Sequence[dict[str, Any]], threshold: int, budget: int, window: int, renderer: Renderer) -> list[Step]:
    import httpx

    from proxy.testing.agent_upstream import AgentScript
    from proxy.testing.replies import Recorded

    direct, proxied, steps, judge = PrefixCache(), PrefixCache(), [], AgentScript(big=True)
    with running_proxy(threshold, budget, window) as (fake, script, url), httpx.Client(base_url=url, timeout=120) as client:
        for sent in requests:
            api = API_PATHS.get(sent["path"]) if sent["method"] == "POST" else None
            if api is None:
                continue  # a probe (HEAD /), count_tokens: not a model call
            body = json.loads(sent["body"])
            before, turns = len(fake.requests), len(script.turns)
            headers = {k: v for k, v in sent["headers"].items() if k.lower() not in NOT_SENT}
            target = sent["path"] + (f"?{sent['query']}" if sent["query"] else "")
            answer = client.request(sent["method"], target, content=sent["body"].encode(), headers=headers)
            if answer.status_code != 200:
                raise SystemExit(f"the proxy answered {answer.status_code}: {answer.text[:300]}")
            calls = [r for r in fake.requests[before:] if r.path in API_PATHS]
            priced = [proxied.price(render(renderer, API_PATHS[r.path], r.json)) for r in calls]
            alone = direct.price(render(renderer, api, body))
            asked = next((t.step for t in reversed(script.turns[turns:]) if t.step), "?")
            judge(Recorded(sent["method"], sent["path"], sent["headers"], sent["body"].encode(), sent["query"]))
            h = answer.headers
            steps.append(
                Step(
                    asked,
                    asked == judge.turns[-1].step,
                    api,
                    h.get("x-pcp-mode", ""),
                    int(h.get("x-pcp-rounds") or 0),
                    int(h.get("x-pcp-prompt-tokens") or 0),
                    alone.total,
                    sum(p.total for p in priced),
                    alone.billed,
                    sum(p.billed for p in priced),
                )  # fmt: skip
            )
    return steps


def table(agent: str, steps: Sequence[Step]) -> str:
    lines = [
        f"**{agent}** ({steps[0].api if steps else '-'})\n",
        "| step | asked | mode | rounds | counted | direct tokens | proxy tokens | direct billed | proxy billed | proxy / direct |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, s in enumerate(steps, 1):
        ratio = f"{s.proxy_billed / s.direct_billed:.2f}" if s.direct_billed else "-"
        lines.append(
            f"| {n} | {s.asked if s.kept else f'**{s.asked}** (not what was asked)'} | {s.mode} | {s.rounds or '-'} | {s.counted:,} | {s.direct_tokens:,} | {s.proxy_tokens:,} | {s.direct_billed:,.0f} | {s.proxy_billed:,.0f} | {ratio} |"
        )
    direct, proxy = sum(s.direct_billed for s in steps), sum(s.proxy_billed for s in steps)
    tokens = (sum(s.direct_tokens for s in steps), sum(s.proxy_tokens for s in steps))
    paged = sum(s.mode == "protocol" for s in steps)
    lines.append(
        f"| all | {paged} of {len(steps)} paged | | | | {tokens[0]:,} | {tokens[1]:,} | {direct:,.0f} | {proxy:,.0f} | {proxy / direct if direct else 0:.2f} |"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default=",".join(AGENTS), help="comma-separated: claude, codex, opencode, aider")
    parser.add_argument("--record", action="store_true", help="record the sessions again (else: those recorded before, recorded when missing)")
    parser.add_argument("--sessions", type=Path, default=SESSIONS, help="where the recorded sessions are")
    parser.add_argument("--threshold", type=int, default=8192, help="PCP_SENTRY_THRESHOLD (the proxy's default: 8,192)")
    parser.add_argument("--budget", type=int, default=40000, help="PCP_CONTEXT_BUDGET: room for an agent's tool definitions")
    parser.add_argument(
        "--window",
        type=int,
        default=0,
        help="PCP_CONTEXT_WINDOW (0: unknown, the proxy's default): known, a session that fits it goes untouched while paging costs more",
    )
    args = parser.parse_args(argv)
    selftest()
    from proxy.tokenizer import Tokenizer

    renderer = Renderer(Tokenizer(ENCODING).encoding)
    print(
        f"pcp-proxy: threshold {args.threshold:,}, context budget {args.budget:,}, window {args.window:,}; billed = uncached + 0.1 x cached input tokens (bench/cost_replay.py)\n"
    )
    for agent in args.agents.split(","):
        path = args.sessions / f"{agent}.jsonl"
        if args.record or not path.exists():
            record(agent, path)
        requests = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        started = time.perf_counter()
        steps = replay(requests, args.threshold, args.budget, args.window, renderer)
        renderer.forget()
        print(table(agent, steps))
        print(f"\n({len(requests)} requests recorded, replayed in {time.perf_counter() - started:.1f} s)\n")


if __name__ == "__main__":
    main()
