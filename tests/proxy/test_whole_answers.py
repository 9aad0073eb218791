"""A server that ignores ``stream`` and answers one JSON object: the client that asked for a stream still gets a whole
one, its API's events to the terminal one, in passthrough and protocol mode, for an answer and for a call of its tools."""

from __future__ import annotations

import json

import pytest

from proxy.testing.apis import api_requests, message, response
from proxy.testing.replies import completion

FORCE = {"x-pcp-mode-request": "force"}
TOOL = {
    "type": "function",
    "function": {"name": "read", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
}
MODES = [pytest.param({}, "passthrough", id="passthrough"), pytest.param(FORCE, "protocol", id="protocol")]


def the_call(answer) -> dict:
    return json.loads(answer)


@pytest.mark.parametrize(("headers", "mode"), MODES)
def test_chat_a_whole_completion_reaches_a_streaming_client_as_chunks_and_done(start_proxy, upstream, headers, mode):
    proxy = start_proxy()
    upstream.enqueue(completion("Sunny, 22 C.", prompt_tokens=30, completion_tokens=5))
    with proxy.http.stream(
        "POST", "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "stream": True}, headers=headers
    ) as raw:
        assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream") and raw.headers["x-pcp-mode"] == mode
        body = raw.read()
    assert body.rstrip().endswith(b"data: [DONE]")
    upstream.enqueue(completion("Sunny, 22 C."))
    chunks = list(proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}], stream=True, extra_headers=headers))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Sunny, 22 C."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize(("headers", "mode"), MODES)
def test_chat_a_whole_tool_call_reaches_a_streaming_client_as_tool_call_deltas(start_proxy, upstream, headers, mode):
    proxy = start_proxy()
    call = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "calc/ops.py"}'}}
    upstream.enqueue(completion(tool_calls=[call]))
    chunks = list(
        proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "Fix it"}], tools=[TOOL], stream=True, extra_headers=headers)
    )
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert (
        deltas[0].function.name == "read"
        and deltas[0].id == "call_1"
        and the_call("".join(d.function.arguments or "" for d in deltas)) == {"path": "calc/ops.py"}
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert json.loads(api_requests(upstream, "chat")[-1].body)["stream"] is True


@pytest.mark.parametrize(("headers", "mode"), MODES)
def test_responses_a_whole_response_reaches_a_streaming_client_as_its_events(start_proxy, upstream, headers, mode):
    proxy = start_proxy()
    upstream.enqueue(response("Sunny, 22 C."))
    with proxy.client().responses.stream(model="m", input="Weather?", extra_headers=headers) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "Sunny, 22 C." and kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds


@pytest.mark.parametrize(("headers", "mode"), MODES)
def test_responses_a_whole_call_reaches_a_streaming_client_as_its_item_events(start_proxy, upstream, headers, mode):
    proxy = start_proxy()
    tools = [
        {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
        {"type": "custom", "name": "apply_patch"},
    ]
    upstream.enqueue(response(None, function_calls=[("read", {"path": "calc/ops.py"})], custom_calls=[("apply_patch", "*** Begin Patch\n")], reasoning=True))
    with proxy.client().responses.stream(model="m", input="Fix it", tools=tools, extra_headers=headers) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["reasoning", "function_call", "custom_tool_call"]
    assert the_call(final.output[1].arguments) == {"path": "calc/ops.py"} and final.output[2].input == "*** Begin Patch\n"
    assert kinds.count("response.output_item.done") == 3 and kinds[-1] == "response.completed"


@pytest.mark.parametrize(("headers", "mode"), MODES)
def test_messages_a_whole_message_reaches_a_streaming_client_as_its_events(start_proxy, upstream, headers, mode):
    proxy = start_proxy(anthropic_base_url="http://anthropic.test")
    upstream.enqueue(message("Sunny, 22 C.", thinking=True, input_tokens=40, output_tokens=6))
    with proxy.anthropic().messages.stream(model="claude", max_tokens=100, messages=[{"role": "user", "content": "Weather?"}], extra_headers=headers) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert [block.type for block in final.content][-1] == "text" and final.content[-1].text == "Sunny, 22 C."
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 6 and kinds[-1] == "message_stop"
    if mode == "passthrough":  # as the upstream said it: its thinking block with its signature
        assert final.content[0].type == "thinking" and final.content[0].signature


@pytest.mark.parametrize(("headers", "mode"), MODES)
def test_messages_a_whole_tool_use_reaches_a_streaming_client_as_its_block_events(start_proxy, upstream, headers, mode):
    proxy = start_proxy(anthropic_base_url="http://anthropic.test")
    tools = [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}]
    upstream.enqueue(message(None, tool_uses=[("Read", {"file_path": "/repo/calc/ops.py"})], thinking=True))
    with proxy.anthropic().messages.stream(
        model="claude", max_tokens=100, messages=[{"role": "user", "content": "Fix it"}], tools=tools, extra_headers=headers
    ) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "tool_use"]
    assert final.content[0].signature and final.content[1].input == {"file_path": "/repo/calc/ops.py"} and final.stop_reason == "tool_use"


def test_a_json_answer_that_is_not_the_apis_reaches_the_client_as_it_came(start_proxy, upstream):
    from proxy.testing.replies import Reply

    proxy = start_proxy()
    upstream.enqueue(Reply(body=b'{"detail": "overloaded, come back later"}'))
    answer = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert answer.status_code == 200 and answer.json() == {"detail": "overloaded, come back later"}
