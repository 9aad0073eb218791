"""Anthropic's context management on an upstream that speaks chat completions only, with the anthropic SDK:
the proxy applies the edits, reports them as Anthropic does, and what they clear is paged, not lost."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from proxy.testing.replies import completion, stream_reply
from proxy.testing.upstream import Recorded, Reply

BETA = ["context-management-2025-06-27"]
TOOLS = [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
CLEAR = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 30_000}}
COMPACT = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}


def result_text(i: int, words: int) -> str:
    return f"file{i}.py holds the marker zebra{i}quokka. " + " ".join(f"token{i}x{k} alpha" for k in range(words))


def tool_history(results: int, words: int) -> list[dict]:
    """A coding agent's history: ``results`` tool calls, each answered by a result of about ``words`` × 3 tokens."""
    messages: list[dict] = [{"role": "user", "content": "Read every file of the project and tell me what you find."}]
    for i in range(results):
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i:02d}", "name": "read_file", "input": {"path": f"file{i}.py"}}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i:02d}", "content": result_text(i, words)}]})
    messages.append({"role": "assistant", "content": "I have read them all."})
    return messages


def chat_upstream(text: str = "Done.") -> object:
    def reply(recorded: Recorded) -> Reply:
        if not recorded.path.endswith("/chat/completions"):
            return Reply(status=404, body=b'{"detail": "Not Found"}')
        if recorded.json.get("stream"):
            return stream_reply([text], usage={"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12})
        return completion(text, prompt_tokens=10, completion_tokens=2)

    return reply


def prompt_tokens(proxy, recorded: Recorded) -> int:
    count = proxy.services.tokenizer.count
    return sum(count(m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))) for m in recorded.json["messages"])


@pytest.fixture
def chat_only_proxy(start_proxy, upstream):
    upstream.default = chat_upstream()
    return start_proxy(translate_apis="always")


def session(proxy, session_id: str, key: str = "sk-ant-client") -> dict:
    shown = proxy.http.get(f"/v1/pcp/sessions/{session_id}", headers={"authorization": f"Bearer {key}"})
    assert shown.status_code == 200, shown.text
    return shown.json()


def originals(shown: dict) -> int:
    return sum(page["type"] == "Original" for page in shown["pages"])


# -- clear_tool_uses ---------------------------------------------------------------------------


def test_cleared_tool_results_are_reported_and_kept_as_pages(chat_only_proxy, upstream):
    messages = tool_history(40, 430)
    messages.append({"role": "user", "content": "Which file holds the marker zebra7quokka?"})
    client = chat_only_proxy.anthropic()
    raw = client.beta.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS, betas=BETA, context_management={"edits": [CLEAR]}
    )
    answer = raw.parse()
    assert raw.http_response.status_code == 200 and answer.content[-1].text == "Done."
    (edit,) = answer.context_management.applied_edits
    assert edit.type == "clear_tool_uses_20250919" and edit.cleared_tool_uses == 37 and edit.cleared_input_tokens > 40_000
    assert raw.headers["x-pcp-mode"] == "protocol"
    # What went upstream is no larger than the request the edit leaves; what it cleared is pages of the session.
    workers = upstream.chat_requests("worker")
    assert workers and max(prompt_tokens(chat_only_proxy, w) for w in workers) < 15_000
    assert all("context_management" not in w.json for w in workers)
    assert originals(session(chat_only_proxy, raw.headers["x-pcp-session"])) >= 40


def test_below_its_trigger_the_edit_clears_nothing_and_the_request_goes_as_it_came(chat_only_proxy, upstream):
    messages = [*tool_history(4, 50), {"role": "user", "content": "And now?"}]
    client = chat_only_proxy.anthropic()
    raw = client.beta.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS, betas=BETA, context_management={"edits": [CLEAR]}
    )
    assert raw.headers["x-pcp-mode"] == "passthrough" and raw.parse().content[0].text == "Done."
    sent = upstream.requests[-1].json
    assert result_text(0, 50) in json.dumps(sent["messages"])


def test_a_streamed_request_gets_the_report_in_its_message_delta(chat_only_proxy):
    messages = [*tool_history(40, 430), {"role": "user", "content": "Which file holds the marker zebra7quokka?"}]
    client = chat_only_proxy.anthropic()
    with client.beta.messages.stream(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS, betas=BETA, context_management={"edits": [CLEAR]}
    ) as stream:
        final = stream.get_final_message()
    assert final.content[-1].text == "Done."
    (edit,) = final.context_management.applied_edits
    assert edit.cleared_tool_uses == 37


def test_thinking_and_tool_inputs_cleared_as_asked(chat_only_proxy, upstream):
    messages = tool_history(40, 430)
    for i in (1, 3, 5):
        messages[i]["content"].insert(0, {"type": "thinking", "thinking": f"I should read file{i}.", "signature": "sig"})
    messages.append({"role": "user", "content": "Which file holds the marker zebra7quokka?"})
    edits = [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}, {**CLEAR, "clear_tool_inputs": True, "exclude_tools": []}]
    answer = chat_only_proxy.anthropic().beta.messages.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS, betas=BETA, context_management={"edits": edits}
    )
    thinking, tools = answer.context_management.applied_edits
    assert thinking.type == "clear_thinking_20251015" and thinking.cleared_thinking_turns == 2
    assert tools.type == "clear_tool_uses_20250919" and tools.cleared_tool_uses == 37


def test_an_edit_the_proxy_does_not_know_is_a_400(chat_only_proxy):
    with pytest.raises(anthropic.BadRequestError, match="not an edit the proxy knows"):
        chat_only_proxy.anthropic().beta.messages.create(
            model="claude-sonnet-4-5", max_tokens=100, messages=[{"role": "user", "content": "hi"}], context_management={"edits": [{"type": "shred"}]}
        )


# -- compact --------------------------------------------------------------------------------


def long_history() -> list[dict]:
    return tool_history(60, 660)  # ~120k tokens


def test_compaction_hands_back_one_block_and_the_next_request_reads_the_pages_behind_it(chat_only_proxy, upstream):
    messages = [*long_history(), {"role": "user", "content": "Summarise what you read."}]
    client = chat_only_proxy.anthropic()
    raw = client.beta.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS, betas=["compact-2026-01-12"], context_management={"edits": [COMPACT]}
    )
    answer = raw.parse()
    blocks = [block for block in answer.content if block.type == "compaction"]
    assert len(blocks) == 1 and answer.content[0].type == "compaction" and answer.content[-1].text == "Done."
    handle = blocks[0].encrypted_content
    assert handle and "zebra" not in handle and raw.headers["x-pcp-mode"] == "protocol"
    first = raw.headers["x-pcp-session"]
    assert originals(session(chat_only_proxy, first)) >= 60

    # The next request carries only the block and a question: paged, with the history's pages behind it.
    upstream.requests.clear()
    follow_up = [
        {"role": "assistant", "content": [blocks[0].model_dump(exclude_none=True)]},
        {"role": "user", "content": "Which file holds the marker zebra7quokka?"},
    ]
    raw = client.beta.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=100, messages=follow_up, tools=TOOLS, betas=BETA)
    assert raw.http_response.status_code == 200 and raw.headers["x-pcp-mode"] == "protocol"
    assert raw.parse().content[-1].text == "Done."
    worker = upstream.chat_requests("worker")[0]
    document = json.dumps(worker.json["messages"])
    assert "<PagedContext" in document and "file12.py" in document  # the history's pages, in the prompt by their summaries
    assert handle not in document


def test_a_compaction_block_is_bound_to_its_caller(chat_only_proxy):
    messages = [*long_history(), {"role": "user", "content": "Summarise what you read."}]
    answer = chat_only_proxy.anthropic().beta.messages.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, betas=BETA, context_management={"edits": [COMPACT]}
    )
    block = answer.content[0].model_dump(exclude_none=True)
    follow_up = [{"role": "assistant", "content": [block]}, {"role": "user", "content": "And?"}]
    with pytest.raises(anthropic.BadRequestError, match="not made by this proxy for this caller"):
        chat_only_proxy.anthropic(api_key="sk-ant-someone-else").beta.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=follow_up)
    forged = {**block, "encrypted_content": block["encrypted_content"][:-4] + "0000", "content": None}
    with pytest.raises(anthropic.BadRequestError):
        chat_only_proxy.anthropic().beta.messages.create(
            model="claude-sonnet-4-5", max_tokens=100, messages=[{"role": "assistant", "content": [forged]}, {"role": "user", "content": "And?"}]
        )


# -- an upstream that speaks Messages --------------------------------------------------------


def test_where_the_upstream_speaks_messages_the_edit_goes_to_it_untouched(start_proxy, upstream):
    proxy = start_proxy(anthropic_base_url="http://anthropic.test")
    native = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [{"type": "text", "text": "Native."}],
        "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1},
        "context_management": {"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 1, "cleared_input_tokens": 9}]},
    }  # fmt: skip
    upstream.enqueue(Reply(body=json.dumps(native).encode()))
    messages = [*tool_history(40, 430), {"role": "user", "content": "And?"}]
    answer = proxy.anthropic().beta.messages.create(model="claude", max_tokens=10, messages=messages, betas=BETA, context_management={"edits": [CLEAR]})
    assert answer.context_management.applied_edits[0].cleared_tool_uses == 1
    sent = upstream.requests[-1]
    assert sent.path.startswith("/v1/messages") and sent.json["context_management"] == {"edits": [CLEAR]}


# -- OpenAI's /responses/compact ---------------------------------------------------------------


def responses_history(calls: int, words: int) -> list[dict]:
    """A Codex session's input: its task, then ``calls`` shell calls and their outputs."""
    items: list[dict] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read every file of the project."}]}]
    for i in range(calls):
        items.append({"type": "function_call", "call_id": f"call_{i:02d}", "name": "shell", "arguments": json.dumps({"command": ["cat", f"file{i}.py"]})})
        items.append({"type": "function_call_output", "call_id": f"call_{i:02d}", "output": result_text(i, words)})
    items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "I have read them all."}]})
    return items


def test_compact_on_a_chat_only_upstream_hands_back_one_compaction_item_that_pages_the_next_request(chat_only_proxy, upstream):
    client = chat_only_proxy.client()
    raw = client.responses.with_raw_response.compact(model="gpt-5.1-codex", input=responses_history(40, 430), instructions="You are Codex.")
    compacted = raw.parse()
    assert raw.http_response.status_code == 200 and compacted.object == "response.compaction"
    kinds = [item.type for item in compacted.output]
    assert kinds.count("compaction") == 1 and kinds[-1] == "compaction"
    assert [item.role for item in compacted.output if item.type == "message"] == ["user"]
    handle = compacted.output[-1].encrypted_content
    assert "zebra" not in handle and upstream.requests == []  # no model call: the history is paged, not summarised
    assert originals(session(chat_only_proxy, raw.headers["x-pcp-session"], "sk-client")) >= 40

    # The next request carries the compacted output and a question: paged, with the history's pages behind it.
    follow_up = [item.model_dump(exclude_none=True) for item in compacted.output]
    follow_up.append({"type": "message", "role": "user", "content": "Which file holds the marker zebra7quokka?"})
    raw = client.responses.with_raw_response.create(model="gpt-5.1-codex", input=follow_up, instructions="You are Codex.")
    assert raw.http_response.status_code == 200 and raw.headers["x-pcp-mode"] == "protocol"
    assert raw.parse().output_text == "Done."
    document = json.dumps(upstream.chat_requests("worker")[0].json["messages"])
    assert "<PagedContext" in document and "file12.py" in document and handle not in document


def test_compacting_again_keeps_the_pages_of_the_first_compaction(chat_only_proxy, upstream):
    client = chat_only_proxy.client()
    first = client.responses.compact(model="m", input=responses_history(20, 100))
    again = [*(item.model_dump(exclude_none=True) for item in first.output), *responses_history(5, 100)[1:]]
    second = client.responses.with_raw_response.compact(model="m", input=again)
    handle = second.parse().output[-1].encrypted_content
    sessions = chat_only_proxy.services.namespaces.opened(chat_only_proxy.services.namespaces.of({"authorization": "Bearer sk-client"}), handle)
    assert len(sessions) == 2 and sessions[0] == second.headers["x-pcp-session"]


def test_a_compaction_item_of_another_caller_is_refused(chat_only_proxy):
    first = chat_only_proxy.client().responses.compact(model="m", input=responses_history(5, 100))
    follow_up = [*(item.model_dump(exclude_none=True) for item in first.output), {"role": "user", "content": "And?"}]
    with pytest.raises(openai.BadRequestError, match="not made by this proxy for this caller"):
        chat_only_proxy.client(api_key="sk-someone-else").responses.create(model="m", input=follow_up)


def test_where_the_upstream_has_compact_it_is_forwarded_untouched(proxy, upstream):
    native = {"id": "resp_1", "object": "response.compaction", "created_at": 1, "output": [{"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAA"}]}
    upstream.enqueue(Reply(body=json.dumps(native).encode()))
    reply = proxy.http.post("/v1/responses/compact", json={"model": "m", "input": "Hello!"})
    assert reply.json() == native and [r.path for r in upstream.requests] == ["/v1/responses/compact"]
    assert reply.headers["x-pcp-mode"] == "passthrough"


def test_where_the_upstream_lacks_compact_the_proxy_serves_it_from_then_on(proxy, upstream):
    upstream.default = chat_upstream()
    first = proxy.http.post("/v1/responses/compact", json={"model": "m", "input": responses_history(3, 50)})
    second = proxy.http.post("/v1/responses/compact", json={"model": "m", "input": responses_history(3, 50)})
    assert first.status_code == second.status_code == 200 and first.json()["output"][-1]["type"] == "compaction"
    assert [r.path for r in upstream.requests] == ["/v1/responses/compact"]


# -- a real proxy on loopback, in front of a chat-only upstream on loopback ------------------------


def test_over_sockets_compaction_then_the_question_it_was_for(start_proxy, served_upstream):
    served_upstream.default = chat_upstream()
    proxy = start_proxy(sockets=True, upstream_base_url=served_upstream.url)  # translate_apis "auto": the upstream's 404 tells
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-client", max_retries=0, timeout=60)
    messages = [*long_history(), {"role": "user", "content": "Summarise what you read."}]
    with client.beta.messages.stream(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS, betas=BETA, context_management={"edits": [COMPACT]}
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["compaction", "text"] and final.content[1].text == "Done."
    follow_up = [
        {"role": "assistant", "content": [final.content[0].model_dump(exclude_none=True)]},
        {"role": "user", "content": "Which file holds zebra7quokka?"},
    ]
    raw = client.beta.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=100, messages=follow_up, tools=TOOLS, betas=BETA)
    assert raw.headers["x-pcp-mode"] == "protocol" and raw.parse().content[-1].text == "Done."
    assert "file12.py" in json.dumps(served_upstream.chat_requests("worker")[-1].json["messages"])


# -- an agent's head, larger than the budget --------------------------------------------------------

AGENT_TOOLS = [
    {
        "name": f"tool_{i}",
        "description": " ".join(f"Step {k} of what tool {i} does, told at length as agents tell it." for k in range(40)),
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for i in range(30)
]


@pytest.mark.parametrize("edit", [CLEAR, COMPACT], ids=["clear", "compact"])
def test_an_agents_edits_are_paged_even_where_its_tools_fill_the_budget(start_proxy, upstream, edit):
    upstream.default = chat_upstream()
    proxy = start_proxy(translate_apis="always", context_budget=4096)
    messages = [*tool_history(60, 660), {"role": "user", "content": "Which file holds the marker zebra7quokka?"}]
    raw = proxy.anthropic().beta.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=[*AGENT_TOOLS, *TOOLS], betas=BETA, context_management={"edits": [edit]}
    )
    answer = raw.parse()
    assert raw.headers["x-pcp-mode"] == "protocol" and answer.content[-1].text == "Done."
    if edit is CLEAR:
        assert answer.context_management.applied_edits[0].cleared_tool_uses == 57
    else:
        assert answer.content[0].type == "compaction"
    assert originals(session(proxy, raw.headers["x-pcp-session"])) >= 60


def test_a_streamed_compaction_that_ends_in_the_agents_tool_call(chat_only_proxy, upstream):
    call = [{"id": "call_9", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "file61.py"}'}}]
    upstream.default = lambda recorded: (
        stream_reply([], tool_calls=call, usage={"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12})
        if recorded.json.get("stream")
        else completion(None, tool_calls=call)
    )
    messages = [*long_history(), {"role": "user", "content": "Read file61.py too."}]
    with chat_only_proxy.anthropic().beta.messages.stream(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS, betas=BETA, context_management={"edits": [COMPACT]}
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["compaction", "tool_use"]
    assert final.content[1].input == {"path": "file61.py"} and final.stop_reason == "tool_use"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_pause_after_compaction_answers_with_the_block_alone(chat_only_proxy, stream):
    messages = [*long_history(), {"role": "user", "content": "Summarise what you read."}]
    asked = {
        "model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages, "betas": BETA,
        "context_management": {"edits": [{**COMPACT, "pause_after_compaction": True}]},
    }  # fmt: skip
    client = chat_only_proxy.anthropic()
    if stream:
        with client.beta.messages.stream(**asked) as streamed:
            final = streamed.get_final_message()
    else:
        final = client.beta.messages.create(**asked)
    assert [block.type for block in final.content] == ["compaction"] and final.stop_reason == "compaction"
