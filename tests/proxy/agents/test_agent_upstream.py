"""The scripted agent upstream speaks as each provider does, keeps the providers' rules, and finds its step from what reaches it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from proxy.testing.agent_task import PATCH, TASK_PROMPT, check_repo, decide, make_repo
from proxy.testing.agent_upstream import AgentScript
from proxy.testing.upstream import FakeUpstream

READ = {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {"filePath": {"type": "string"}}}}}
BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
EDIT = {"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {"filePath": {}, "oldString": {}, "newString": {}}}}}


@pytest.fixture
def script() -> AgentScript:
    return AgentScript()


@pytest.fixture
def upstream(script: AgentScript) -> Iterator[FakeUpstream]:
    with FakeUpstream(script) as fake:
        yield fake


def test_the_script_goes_read_grep_edit_test_answer_by_what_the_conversation_shows():
    said = TASK_PROMPT
    steps = []
    for evidence in [
        '"""calc.ops: arithmetic helpers (ticket CALC-17)."""',
        "calc/ops.py:4:def add_totals(first, second):",
        "+    return first + second",
        "Ran 2 tests in 0.001s\n\nOK",
    ]:
        steps.append(decide(said, big=False)["step"])
        said += "\n" + evidence
    steps.append(decide(said, big=False)["step"])
    assert steps == ["read", "grep", "edit", "test", "answer"]
    # Behind a proxy the conversation is a <PagedContext> document; the latest result in it decides.
    paged = f"<PagedContext><Query>(calls bash(grep)) (bash returned: calc/ops.py:4:def add_totals(first, second):)</Query>{TASK_PROMPT} CALC-17</PagedContext>"
    assert decide(paged, big=False)["step"] == "edit"


def test_a_chat_stream_carries_the_tool_call_as_opencode_reads_it(upstream: FakeUpstream, script: AgentScript):
    client = openai.OpenAI(base_url=upstream.url, api_key="k", max_retries=0)
    messages = [{"role": "system", "content": "Working directory: /work/task"}, {"role": "user", "content": TASK_PROMPT}]
    stream = client.chat.completions.create(model="m", messages=messages, tools=[READ, BASH, EDIT], stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    calls = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or ()]
    assert calls[0].function.name == "read" and json.loads("".join(c.function.arguments or "" for c in calls)) == {"filePath": "/work/task/calc/ops.py"}
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    assert script.turns[-1].flavor == "opencode" and script.turns[-1].step == "read"


def test_a_responses_stream_carries_a_custom_tool_call_as_codex_reads_it(upstream: FakeUpstream):
    client = openai.OpenAI(base_url=upstream.url, api_key="k", max_retries=0)
    tools = [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "text"}},
    ]
    evidence = "CALC-17\ncalc/ops.py:4:def add_totals(first, second):"
    with client.responses.stream(model="m", input=[{"role": "user", "content": f"{TASK_PROMPT}\n{evidence}"}], tools=tools) as stream:
        final = stream.get_final_response()
    (item,) = final.output
    assert item.type == "custom_tool_call" and item.name == "apply_patch" and item.input == PATCH


def test_a_messages_stream_carries_the_tool_use_as_claude_code_reads_it(upstream: FakeUpstream, script: AgentScript):
    client = anthropic.Anthropic(base_url=upstream.url.removesuffix("/v1"), api_key="k", max_retries=0)
    tools = [
        {"name": name, "input_schema": {"type": "object", "properties": {key: {"type": "string"} for key in keys}}}
        for name, keys in (("Bash", ["command", "description"]), ("Read", ["file_path"]), ("Edit", ["file_path", "old_string", "new_string"]))
    ]
    system = "Primary working directory: /work/task"
    with client.messages.stream(model="m", max_tokens=100, system=system, messages=[{"role": "user", "content": TASK_PROMPT}], tools=tools) as stream:
        final = stream.get_final_message()
    (use,) = final.content
    assert use.type == "tool_use" and use.name == "Read" and use.input == {"file_path": "/work/task/calc/ops.py"} and final.stop_reason == "tool_use"
    assert script.turns[-1].flavor == "claude"


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        (
            "/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]},
            "role 'tool'",
        ),
        ("/responses", {"model": "m", "input": [{"type": "function_call_output", "call_id": "c1", "output": "r"}]}, "No tool call found"),
        (
            "/messages",
            {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]},
            "tool_use_id",
        ),
        (
            "/messages",
            {
                "model": "m",
                "max_tokens": 9,
                "messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}, {"role": "user", "content": "go"}],
            },
            "signature",
        ),
    ],
)
def test_what_a_provider_refuses_is_refused_with_its_400(upstream: FakeUpstream, script: AgentScript, path: str, body: dict, said: str):
    answer = httpx.post(upstream.url + path, json=body)
    assert answer.status_code == 400 and said in answer.text
    assert script.turns[-1].refused and said in script.turns[-1].refused


def test_a_server_that_ignores_stream_answers_one_json_object(upstream: FakeUpstream):
    upstream.default = AgentScript(json_for_stream=True)
    answer = httpx.post(upstream.url + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert answer.headers["content-type"].startswith("application/json") and answer.json()["object"] == "chat.completion"


def test_the_task_repo_fails_its_tests_until_the_line_is_fixed(tmp_path):
    make_repo(str(tmp_path))
    assert check_repo(str(tmp_path))["tests_pass"] is False
    ops = tmp_path / "calc" / "ops.py"
    ops.write_text(ops.read_text().replace("first - second", "first + second"))
    assert check_repo(str(tmp_path)) | {"test_output": ""} == {"fixed": True, "tests_pass": True, "test_output": ""}
