"""Agents' tool-heavy histories, paged or forwarded: the upstream never receives a tool result without the call that
asked for it, nor a thinking block without its signature (it would refuse the request, as the scripted upstream does)."""

from __future__ import annotations

import json

import pytest

from proxy.testing.agent_task import TASK_PROMPT
from proxy.testing.agent_upstream import AgentScript

FORCE = {"x-pcp-mode-request": "force"}
ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-test"}
OPS = '"""calc.ops: arithmetic helpers (ticket CALC-17)."""\n\ndef add_totals(first, second):\n    return first - second\n'
GREP = "calc/ops.py:4:def add_totals(first, second):\ncalc/ops.py:9:def scale(value, factor):"


def chat_call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are opencode. Working directory: /repo"},
        {"role": "user", "content": TASK_PROMPT},
        {"role": "assistant", "content": "", "tool_calls": [chat_call("c1", "read", {"filePath": "/repo/calc/ops.py"})]},
        {"role": "tool", "tool_call_id": "c1", "content": OPS},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [chat_call("c2", "bash", {"command": "grep -rn def calc"}), chat_call("c3", "bash", {"command": "ls"})],
        },
        {"role": "tool", "tool_call_id": "c2", "content": GREP},
        {"role": "tool", "tool_call_id": "c3", "content": "calc docs tests"},
    ],
    "tools": [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {key: {"type": "string"} for key in keys}}}}
        for name, keys in (("read", ["filePath"]), ("bash", ["command"]), ("edit", ["filePath", "oldString", "newString"]))
    ],
}
RESPONSES = {
    "model": "m",
    "store": False,
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex. <cwd>/repo</cwd>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK_PROMPT}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-opaque"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command", "arguments": json.dumps({"cmd": "cat calc/ops.py"})},
        {"type": "function_call_output", "call_id": "call_1", "output": OPS},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAA-opaque-2"},
        {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "exec_command", "arguments": json.dumps({"cmd": "grep -rn def calc"})},
        {"type": "function_call_output", "call_id": "call_2", "output": GREP},
    ],
    "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch"},
    ],
    "include": ["reasoning.encrypted_content"],
}
MESSAGES = {
    "model": "claude",
    "max_tokens": 2000,
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "system": [{"type": "text", "text": "You are Claude Code. Primary working directory: /repo"}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": TASK_PROMPT}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Read the file first.", "signature": "sig-1"},
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/repo/calc/ops.py"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": OPS}]},
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "grep -rn def calc"}},
                {"type": "tool_use", "id": "t3", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": GREP}]},
                {"type": "tool_result", "tool_use_id": "t3", "content": "calc docs tests", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ],
    "tools": [
        {"name": name, "input_schema": {"type": "object", "properties": {key: {"type": "string"} for key in keys}}}
        for name, keys in (("Read", ["file_path"]), ("Bash", ["command"]), ("Edit", ["file_path", "old_string", "new_string"]))
    ],
}
APIS = {"chat": ("/v1/chat/completions", CHAT), "responses": ("/v1/responses", RESPONSES), "messages": ("/v1/messages", MESSAGES)}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("mode", ["passthrough", "protocol"])
@pytest.mark.parametrize("api", list(APIS))
def test_the_upstream_never_gets_a_result_without_its_call_nor_thinking_without_its_signature(start_proxy, upstream, api, mode, stream):
    upstream.default = script = AgentScript()
    proxy = start_proxy(sentry_threshold=10_000_000 if mode == "passthrough" else 1, context_budget=40000)
    path, body = APIS[api]
    answer = proxy.http.post(path, json={**body, "stream": stream}, headers={**ANTHROPIC, **(FORCE if mode == "protocol" else {})})
    assert answer.status_code == 200, answer.text[:500]
    assert answer.headers["x-pcp-mode"] == mode
    called = [turn for turn in script.turns if turn.api == api]
    assert called and all(turn.status == 200 and not turn.refused for turn in called), [turn.refused for turn in called]
    assert [turn.step for turn in called][-1] == "edit"  # the last results (the grep's) reached the model: its next step is the edit
    assert all(turn.paged for turn in called) == (mode == "protocol")
