"""What coding agents send, served: the query string, the endpoints around the APIs, ``HEAD /``, WebSocket upgrades,
and the Query a worker reads of an agent's request (the user's task, a tool's result with its call)."""

from __future__ import annotations

import json
import re

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from proxy.testing.apis import api_requests, worker_document

ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-test"}
FORCE = {"x-pcp-mode-request": "force"}
TASK = "The unit tests in tests/test_ops.py fail. Find and fix the bug in the calc package."
BODIES = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": TASK}]}),
    "responses": ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": TASK}]}),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": TASK}]}),
}


def query_of(recorded) -> str:
    found = re.search(r"<Query>(.*?)</Query>", worker_document(recorded), re.S)
    assert found, worker_document(recorded)[-400:]
    return found.group(1)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["passthrough", "protocol"])
@pytest.mark.parametrize("api", list(BODIES))
def test_the_query_string_reaches_the_upstream_in_both_modes(start_proxy, upstream, api, mode, stream):
    proxy = start_proxy()
    path, body = BODIES[api]
    answer = proxy.http.post(f"{path}?beta=true", json={**body, "stream": stream}, headers={**ANTHROPIC, **(FORCE if mode == "protocol" else {})})
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == mode
    (sent,) = api_requests(upstream, api)
    assert sent.path == path and sent.query == "beta=true"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/messages/batches", {"requests": []}),
        ("GET", "/v1/messages/batches/msgbatch_1/results", None),
        ("GET", "/v1/responses/resp_1?include[]=reasoning.encrypted_content", None),
        ("GET", "/v1/responses/resp_1/input_items?limit=5", None),
        ("POST", "/v1/responses/resp_1/cancel", {}),
        ("DELETE", "/v1/responses/resp_1", None),
        ("POST", "/v1/responses/input_tokens", {"model": "m", "input": TASK}),
        ("POST", "/v1/responses/compact", {"model": "m", "input": [{"role": "user", "content": TASK}]}),
        ("GET", "/v1/models?limit=20", None),
    ],
)
def test_every_endpoint_an_agent_calls_beside_the_paged_ones_is_forwarded_as_it_came(start_proxy, upstream, method, path, body):
    proxy = start_proxy(sentry_threshold=1)  # however small the threshold: these are never paged
    content = json.dumps(body).encode() if body is not None else None
    answer = proxy.http.request(method, path, content=content, headers={**ANTHROPIC, **({"content-type": "application/json"} if content else {})})
    assert answer.status_code == 200 and answer.headers["x-pcp-mode"] == "passthrough"
    sent = upstream.requests[-1]
    target, _, query = path.partition("?")
    assert (sent.method, sent.path, sent.query, sent.body) == (method, target, query, content or b"")
    assert sent.headers["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize("method", ["HEAD", "GET"])
def test_the_root_answers_a_connectivity_probe(proxy, method):
    answer = proxy.http.request(method, "/")  # Claude Code's first call: HEAD /
    assert answer.status_code == 200
    assert answer.content == (b"" if method == "HEAD" else b'{"status": "ok"}')


def test_a_websocket_upgrade_is_refused_with_426_so_that_codex_falls_back_to_http_at_once(start_proxy, upstream):
    proxy = start_proxy(sockets=True)
    url = proxy.url.replace("http://", "ws://") + "/v1/responses"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers={"authorization": "Bearer sk-test", "openai-beta": "responses_websockets=2026-02-06"}, open_timeout=10)
    response = refused.value.response
    assert response.status_code == 426
    assert json.loads(response.body)["error"]["code"] == "websocket_unsupported"
    assert upstream.requests == []
    assert proxy.http.post("/v1/responses", json=BODIES["responses"][1]).status_code == 200  # HTTP goes on as before


def test_claude_codes_system_message_after_the_task_leaves_the_task_the_query(start_proxy, upstream):
    proxy = start_proxy(anthropic_base_url="http://anthropic.test")
    reminder = {"type": "text", "text": "<system-reminder>Keep it short.</system-reminder>"}
    messages = [
        {"role": "user", "content": [reminder, {"type": "text", "text": TASK, "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": "Available agent types for the Agent tool: general-purpose, Explore, Plan."},
    ]
    body = {"model": "claude-opus-4-8", "max_tokens": 64000, "system": [{"type": "text", "text": "You are Claude Code."}], "messages": messages}
    answer = proxy.http.post("/v1/messages?beta=true", json=body, headers={**ANTHROPIC, **FORCE})
    assert answer.status_code == 200
    (worker,) = api_requests(upstream, "messages", role="worker")
    assert TASK in query_of(worker) and "Available agent types" not in query_of(worker)
    assert "Available agent types" in worker.json["system"] and "Available agent types" not in worker_document(worker)  # an instruction: the head's


def test_a_chat_query_of_tool_results_shows_the_worker_the_call_that_asked(start_proxy, upstream):
    proxy = start_proxy()
    call = {"id": "call_1", "type": "function", "function": {"name": "edit", "arguments": json.dumps({"filePath": "calc/ops.py", "newString": "a + b"})}}
    messages = [
        {"role": "system", "content": "You are opencode."},
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Edit applied successfully."},
    ]
    answer = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=FORCE)
    assert answer.status_code == 200
    query = query_of(api_requests(upstream, "chat", role="worker")[0])
    assert "(calls edit(" in query and "a + b" in query and "(edit returned: Edit applied successfully.)" in query


def tools_of(api: str, n: int = 12) -> list[dict]:
    """``n`` tools with long descriptions, as ``api`` writes them (a coding agent's are ~16k tokens)."""
    described = [(f"tool_{i}", f"Tool {i} reads the repository's files and reports on the ledger, invoice {i} and audit trail. " * 8) for i in range(n)]
    schema = {"type": "object", "properties": {"path": {"type": "string", "description": "the file"}}}
    if api == "chat":
        return [{"type": "function", "function": {"name": name, "description": text, "parameters": schema}} for name, text in described]
    if api == "responses":
        return [{"type": "function", "name": name, "description": text, "parameters": schema} for name, text in described]
    return [{"name": name, "description": text, "input_schema": schema} for name, text in described]


@pytest.mark.parametrize("api", list(BODIES))
def test_the_sentry_counts_the_requests_tool_definitions(start_proxy, upstream, api):
    proxy = start_proxy(sentry_threshold=1000, context_budget=40000)
    path, body = BODIES[api]
    tools = tools_of(api)
    bare = proxy.http.post(path, content=json.dumps(body), headers={**ANTHROPIC, "content-type": "application/json"})
    tooled = proxy.http.post(path, content=json.dumps({**body, "tools": tools}), headers={**ANTHROPIC, "content-type": "application/json"})
    tool_tokens = proxy.services.tokenizer.count(json.dumps(tools))
    assert tool_tokens > 1000 > int(bare.headers["x-pcp-prompt-tokens"])
    assert int(tooled.headers["x-pcp-prompt-tokens"]) == int(bare.headers["x-pcp-prompt-tokens"]) + tool_tokens
    assert (bare.headers["x-pcp-mode"], tooled.headers["x-pcp-mode"]) == ("passthrough", "protocol")


def test_two_agents_that_name_their_sessions_keep_two_sessions_however_alike_they_start(start_proxy, upstream):
    proxy = start_proxy(anthropic_base_url="http://anthropic.test")
    system = [{"type": "text", "text": "You are Claude Code."}]
    first = {"role": "user", "content": [{"type": "text", "text": TASK}]}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "calc/ops.py"}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "def add_totals(a, b): return a - b"}]}

    def send(agent: str, messages: list[dict]) -> str:
        body = {"model": "claude", "max_tokens": 100, "system": system, "messages": messages}
        answer = proxy.http.post("/v1/messages", json=body, headers={**ANTHROPIC, **FORCE, "x-claude-code-session-id": agent})
        assert answer.status_code == 200
        return answer.headers["x-pcp-session"]

    a, b = send("agent-a", [first]), send("agent-b", [first])
    assert a != b  # the same first request, two agents
    assert send("agent-a", [first, call, result]) == a and send("agent-b", [first, call, result]) == b
    sub = {"role": "user", "content": "You are a sub-agent: list the tests."}
    assert send("agent-a", [sub]) not in (a, b)  # another conversation of agent a: a session of its own
