"""Real coding agents finish a real task through the proxy: Claude Code (Messages), Codex CLI (Responses), opencode and
aider (chat completions), each installed by ``make agents`` and run offline against the scripted upstream.

Each agent runs the task (read a file, run a command, edit the file, run the
tests, answer) twice: below the threshold (every call forwarded) and with a
threshold its history crosses on the way (the command prints ~6k tokens of
notes), so that most of its steps run in protocol mode. The repo must end up
fixed with its tests passing, and the agent must never see a 5xx, an empty
200, a stream without its terminal event, the proxy's ``<PagedContext>`` or a
directive. Two agents at once keep two sessions; a server that ignores
``stream`` and Codex's WebSocket first try are met as the agents need.

The context budget is 40,000 tokens of pages in these runs, on top of the
agents' own head (Claude Code's tools are ~16k tokens), which goes whole; one
run per agent is at the proxy's defaults, every call paged by force.
Wall time: ~80 s for the whole module on 2 cores (opencode's start-up is ~8 s
a run, aider's ~5 s; Claude Code and Codex finish in 1-3 s).
"""

from __future__ import annotations

import concurrent.futures
import subprocess
from pathlib import Path

import pytest

from proxy.settings import ModelSettings
from proxy.testing.agent_task import notes_text
from proxy.testing.agent_upstream import AgentScript

from .agents import AGENTS, COMMANDS, AgentRun, agent_env, installed, missing, run_agent
from .recording import AgentProxy, Exchange, agent_proxy, seen_problems

BUDGET = 40000  # of pages, on top of the agents' head (see the module's docstring)
# The models' windows unknown (their families' are known: claude-*, gpt-5*): above the threshold every call is
# paged, as these runs mean to, where a known window would send a session this short untouched.
UNKNOWN_WINDOWS = {"*": ModelSettings(context_window=0)}
BELOW = 10_000_000  # no request of the task comes near it
# A threshold each agent's history crosses during the task, measured on the pinned versions (x-pcp-prompt-tokens):
# Claude Code's calls count ~17.6k tokens before the command's output and ~22.8k after it, Codex's ~7.7k and
# ~12.9k, opencode's ~6.5k and ~11.7k; aider's two calls count ~2.5k and ~10.1k: both are paged.
CROSSED = {"claude": 20000, "codex": 10000, "opencode": 9000, "aider": 2000}
# The header each agent names its own session with: two of them at once are told apart by it.
SESSION_HEADER = {"claude": "x-claude-code-session-id", "codex": "session-id"}


def needs(agent: str) -> None:
    if not installed(agent):
        pytest.skip(missing(agent))


def task_calls(exchanges: list[Exchange]) -> list[Exchange]:
    """The agent's calls of a paged API, but for its side requests (a title, a commit message: no tools, a short prompt)."""
    return [e for e in exchanges if e.api and int(e.response_headers.get("x-pcp-prompt-tokens") or 0) > 1000]


def assert_done(run: AgentRun, proxy: AgentProxy) -> None:
    assert run.done, run.summary()
    assert seen_problems(proxy.exchanges) == []
    refused = [turn for turn in proxy.script.turns if turn.refused and not (turn.role != "worker" and " tokens > " in turn.refused)]
    assert not refused, "the upstream refused a call: " + str([t.refused for t in refused])  # but for a window it taught the proxy
    assert not [turn for turn in proxy.script.turns if turn.compacting], "the agent compacted its own history"
    assert not [e for e in proxy.exchanges if e.path.endswith("/compact")], "the agent compacted its own history"
    for leak in ("<PagedContext", "Consult(", "Explore(", "Shelve("):
        assert leak not in run.stdout, f"{run.agent} printed {leak!r}"


@pytest.mark.parametrize("agent", AGENTS)
def test_an_agent_finishes_the_task_with_every_call_forwarded(agent, tmp_path: Path):
    needs(agent)
    with agent_proxy(tmp_path / "data", AgentScript(big=True), sentry_threshold=BELOW, context_budget=BUDGET, models=UNKNOWN_WINDOWS) as proxy:
        run = run_agent(agent, proxy.url, tmp_path / "run")
    assert_done(run, proxy)
    calls = task_calls(proxy.exchanges)
    assert len(calls) >= 2 and {e.mode for e in calls} == {"passthrough"}
    assert not any(turn.paged for turn in proxy.script.turns)


@pytest.mark.parametrize("agent", AGENTS)
def test_an_agent_finishes_the_task_with_most_of_its_steps_in_protocol_mode(agent, tmp_path: Path):
    needs(agent)
    with agent_proxy(tmp_path / "data", AgentScript(big=True), sentry_threshold=CROSSED[agent], context_budget=BUDGET, models=UNKNOWN_WINDOWS) as proxy:
        run = run_agent(agent, proxy.url, tmp_path / "run")
    assert_done(run, proxy)
    modes = [e.mode for e in task_calls(proxy.exchanges)]
    assert modes.count("protocol") > len(modes) / 2, modes
    worker = [turn for turn in proxy.script.turns if turn.role == "worker"]
    assert worker and all(turn.paged for turn in worker)  # the upstream read a <PagedContext>, and still found its step
    if agent != "aider":  # the calls after the threshold continue one session (aider rewrites its history each call)
        assert len({e.response_headers["x-pcp-session"] for e in task_calls(proxy.exchanges) if e.mode == "protocol"}) == 1


@pytest.mark.parametrize("agent", AGENTS)
def test_an_agent_gets_a_stream_from_a_server_that_ignores_stream(agent, tmp_path: Path):
    """Claude Code retried six times and never got an answer, Codex failed its turn, opencode looped: the proxy
    turns such a server's JSON into the API's events, in passthrough (the first steps) and protocol mode (the last)."""
    needs(agent)
    with agent_proxy(
        tmp_path / "data", AgentScript(big=True, json_for_stream=True), sentry_threshold=CROSSED[agent], context_budget=BUDGET, models=UNKNOWN_WINDOWS
    ) as proxy:
        run = run_agent(agent, proxy.url, tmp_path / "run")
    assert_done(run, proxy)
    assert all(not turn.stream for turn in proxy.script.turns)  # every answer came whole


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_two_agents_at_once_keep_two_sessions(agent, tmp_path: Path):
    """Two of the same agent, one key, the same task in two repos: their histories differ only by their folders."""
    needs(agent)
    proxy_at = agent_proxy(tmp_path / "data", AgentScript(big=True), sentry_threshold=CROSSED[agent] // 4, context_budget=BUDGET, models=UNKNOWN_WINDOWS)
    with proxy_at as proxy, concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda n: run_agent(agent, proxy.url, tmp_path / f"run{n}"), range(2)))
    for run in runs:
        assert_done(run, proxy)
    sessions: dict[str, set[str]] = {}
    for e in task_calls(proxy.exchanges):
        assert e.mode == "protocol"
        sessions.setdefault(e.headers[SESSION_HEADER[agent]], set()).add(e.response_headers["x-pcp-session"])
    assert len(sessions) == 2, sessions  # two agents
    first, second = sessions.values()
    assert len(first) == len(second) == 1 and first != second, sessions  # each kept one session of its own


def test_codex_with_websockets_on_falls_back_to_http_after_one_try(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    needs("codex")
    monkeypatch.setenv("PCP_TEST_CODEX_WEBSOCKETS", "1")  # the provider says supports_websockets = true
    with agent_proxy(tmp_path / "data", AgentScript(), sentry_threshold=BELOW, context_budget=BUDGET, models=UNKNOWN_WINDOWS) as proxy:
        run = run_agent("codex", proxy.url, tmp_path / "run")
    assert_done(run, proxy)
    tries = [e for e in proxy.exchanges if e.websocket]
    assert len(tries) == 1 and tries[0].status == 426  # where a 403 cost it seven tries and ~7 s


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_an_agent_paged_on_every_call_at_the_proxys_defaults(agent, tmp_path: Path):
    """No setting but the upstream: the agent's head (Claude Code's ~16k tokens of tools) goes whole on top of its
    model family's budget, so that every call, paged by force, is paged and the task is done."""
    needs(agent)
    with agent_proxy(tmp_path / "data", AgentScript(big=True)) as proxy:
        run = run_agent(agent, proxy.url, tmp_path / "run", force=True)
    assert_done(run, proxy)
    calls = task_calls(proxy.exchanges)
    assert len(calls) >= 2 and {e.mode for e in calls} == {"protocol"}, [e.mode for e in calls]
    worker = [turn for turn in proxy.script.turns if turn.role == "worker"]
    assert worker and all(turn.paged for turn in worker)


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_an_agent_given_100k_tokens_on_stdin_is_paged_at_the_proxys_defaults(agent, tmp_path: Path):
    """``claude -p`` / ``codex exec -`` with ~100k tokens of notes piped in, and no setting but the upstream: its model's
    family (claude-*, gpt-5*) pages it within its budget, its head whole, and the task is done."""
    needs(agent)
    with agent_proxy(tmp_path / "data", AgentScript(big=True)) as proxy:
        run = run_agent(agent, proxy.url, tmp_path / "run", stdin=notes_text(2200))
    assert_done(run, proxy)
    calls = task_calls(proxy.exchanges)
    assert all(int(e.response_headers["x-pcp-prompt-tokens"]) > 100_000 for e in calls)
    assert len(calls) >= 2 and {e.mode for e in calls} == {"protocol"}, [e.mode for e in calls]
    worker = [turn for turn in proxy.script.turns if turn.role == "worker"]
    assert worker and all(turn.paged for turn in worker)


# A longer task (the notes in fourteen parts of ~1.8k tokens, a step each) on a model whose window is smaller than its name
# says: a local server behind a client that names a known model. The history outgrows the window halfway through.
PARTS, SMALL_WINDOW = 14, 24_000


@pytest.mark.parametrize("agent", AGENTS)
def test_an_agent_finishes_a_longer_task_at_the_proxys_defaults_on_a_model_with_a_small_window(agent, tmp_path: Path):
    """No setting but the upstream, whose model refuses prompts past 24k tokens in its provider's words. The proxy
    forwards the agent's calls untouched until the first is refused, learns the window the refusal names, and pages
    that call and every later one within it: the agent never sees the refusal, never compacts, and finishes."""
    needs(agent)
    with agent_proxy(tmp_path / "data", AgentScript(parts=PARTS, window=SMALL_WINDOW)) as proxy:
        run = run_agent(agent, proxy.url, tmp_path / "run", parts=PARTS)
    assert_done(run, proxy)
    turns = proxy.script.turns
    # Learned once, where the model's name was a known family's (Claude Code's, Codex's); opencode's and aider's
    # unknown model is paged from the chat threshold on, before its history nears the window.
    assert len([turn for turn in turns if turn.refused]) <= 1, [t.refused for t in turns if t.refused]
    assert all(turn.prompt_tokens <= SMALL_WINDOW for turn in turns if turn.status == 200)
    calls = task_calls(proxy.exchanges)
    assert max(int(e.response_headers["x-pcp-prompt-tokens"]) for e in calls) > SMALL_WINDOW  # untouched, the history would not fit
    assert [e.mode for e in calls][-1] == "protocol" and all(e.status == 200 for e in calls), [(e.mode, e.status) for e in calls]


def test_claude_codes_manual_compact_is_answered_from_the_pages(tmp_path: Path):
    """``/compact`` after the task, then a question on a detail only the first tool result held (the ticket in the file's
    docstring). The proxy answers the compaction itself (no model call) with a summary that carries a handle to the
    pages; the question, whose history is now that summary, is paged with the pages behind it: the detail reaches
    the model."""
    needs("claude")
    with agent_proxy(tmp_path / "data", AgentScript(parts=3)) as proxy:
        run = run_agent("claude", proxy.url, tmp_path / "run", parts=3)
        assert_done(run, proxy)
        command, env = COMMANDS["claude"](proxy.url, tmp_path / "run", run.repo, tmp_path / "run" / "home", False)
        before, turns = len(proxy.exchanges), len(proxy.script.turns)
        again = [command[0], "--continue", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions", "-p"]
        for prompt in ("/compact", "Which ticket does the docstring of calc/ops.py name?"):
            done = subprocess.run([*again, prompt], cwd=run.repo, env=agent_env(tmp_path / "run", env), capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-1000:]
        compaction, question = [e for e in proxy.exchanges[before:] if e.api]
        asked = proxy.script.turns[turns:]
    assert compaction.mode == "protocol" and b"[pcp-pages: " in compaction.body  # answered here: the upstream never saw it
    assert not [turn for turn in asked if turn.compacting]
    assert question.mode == "protocol" and question.status == 200
    (worker,) = [turn for turn in asked if turn.role == "worker"]
    assert worker.paged and "read" in worker.seen, worker.seen  # the file's docstring, from the pages behind the summary


def test_codex_compacting_on_its_own_is_answered_from_the_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Codex set to compact past ~16k tokens of its own count, with no /responses/compact upstream: it compacts with
    its own prompt, which the proxy answers from the pages, and the task goes on to its end from the summary and
    the pages behind it (where the scripted model's one-line summary would have lost the task's state)."""
    needs("codex")
    monkeypatch.setenv("PCP_TEST_CODEX_COMPACT_AT", "16000")
    with agent_proxy(tmp_path / "data", AgentScript(parts=6)) as proxy:
        run = run_agent("codex", proxy.url, tmp_path / "run", parts=6)
    assert run.done, run.summary()
    assert seen_problems(proxy.exchanges) == []
    compactions = [e for e in proxy.exchanges if e.api and b"[pcp-pages: " in e.body and e.mode == "protocol"]
    assert compactions and not [turn for turn in proxy.script.turns if turn.compacting]
