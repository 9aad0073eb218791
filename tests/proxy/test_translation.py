"""The Responses and Messages APIs on an upstream that speaks only chat completions: translated there and back,
with the openai and anthropic SDKs, streamed and not, tool calls and usage included; untouched where the upstream
speaks the API itself."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from proxy.testing.apis import answer, api_of, worker_document
from proxy.testing.upstream import Recorded, Reply, completion, stream_reply

from .test_protocol import BUDGET, long_history

WEATHER_CALL = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]


def chat_only(text: str = "Bonjour.", tool_calls: list | None = None, status: int = 200):
    """An upstream with chat completions alone: /responses and /messages are a 404, as vLLM's or Ollama's."""

    def reply(recorded: Recorded) -> Reply:
        if not recorded.path.endswith("/chat/completions"):
            return Reply(status=404, body=b'{"detail": "Not Found"}')
        if status >= 400:
            return Reply(status=status, body=json.dumps({"error": {"message": "max_tokens: type must be number", "type": "invalid_request_error"}}).encode())
        usage = {"prompt_tokens": 21, "completion_tokens": 5, "total_tokens": 26, "prompt_tokens_details": {"cached_tokens": 8}}
        if recorded.json.get("stream"):
            if tool_calls:
                return _streamed_calls(tool_calls, usage)
            return stream_reply([text[:3], text[3:]], usage=usage)
        reply = completion(text, tool_calls=tool_calls, prompt_tokens=21, completion_tokens=5)
        body = json.loads(reply.body)
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": 8}
        return Reply(body=json.dumps(body).encode())

    return reply


def _streamed_calls(calls: list, usage: dict) -> Reply:
    def chunk(delta: dict, finish: str | None = None, **extra) -> bytes:
        return f"data: {json.dumps({'id': 'c1', 'object': 'chat.completion.chunk', 'model': 'm', 'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish}], **extra})}\n\n".encode()

    arguments = calls[0]["function"]["arguments"]
    head = {"index": 0, "id": calls[0]["id"], "type": "function", "function": {"name": calls[0]["function"]["name"], "arguments": ""}}
    chunks = [
        chunk({"role": "assistant", "content": None, "tool_calls": [head]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:6]}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[6:]}}]}),
        chunk({}, "tool_calls"),
        f"data: {json.dumps({'id': 'c1', 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n".encode(),
        b"data: [DONE]\n\n",
    ]
    return Reply(headers={"content-type": "text/event-stream"}, chunks=list(chunks))


def paths(upstream) -> list[str]:
    return [r.path for r in upstream.requests]


# -- Responses ---------------------------------------------------------------------------


def test_responses_are_translated_once_the_upstream_lacks_them_and_that_is_remembered(proxy, upstream):
    upstream.default = chat_only("Bonjour.")
    client = proxy.client()

    first = client.responses.create(model="m", instructions="Be brief.", input="Hello!", max_output_tokens=50, temperature=0)
    second = client.responses.create(model="m", input="Again")

    assert first.output_text == "Bonjour." and first.status == "completed" and second.output_text == "Bonjour."
    assert (first.usage.input_tokens, first.usage.output_tokens, first.usage.input_tokens_details.cached_tokens) == (21, 5, 8)
    assert paths(upstream) == ["/v1/responses", "/v1/chat/completions", "/v1/chat/completions"]  # the 404 once, then straight to chat
    sent = upstream.requests[1].json
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    assert (sent["max_tokens"], sent["temperature"]) == (50, 0)


def test_a_responses_stream_is_translated_event_by_event(proxy, upstream):
    upstream.default = chat_only("Bonjour.")
    events = list(proxy.client().responses.create(model="m", input="Hello!", stream=True))

    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Bonjour."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "Bonjour." and final.usage.output_tokens == 5
    assert upstream.requests[-1].json["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
def test_a_responses_tool_call_comes_back_as_a_function_call_item(proxy, upstream, stream):
    upstream.default = chat_only(tool_calls=WEATHER_CALL)
    tools = [
        {"type": "function", "name": "get_weather", "description": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    ]
    client = proxy.client()
    if stream:
        events = list(client.responses.create(model="m", input="Weather in Paris?", tools=tools, stream=True))
        assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == '{"city": "Paris"}'
        output = events[-1].response.output
    else:
        output = client.responses.create(model="m", input="Weather in Paris?", tools=tools, tool_choice="auto").output
    call = output[0]
    assert (call.type, call.call_id, call.name, json.loads(call.arguments)) == ("function_call", "call_1", "get_weather", {"city": "Paris"})
    sent = upstream.requests[-1].json
    assert sent["tools"] == [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": tools[0]["parameters"]}}]


def test_a_function_call_and_its_output_are_one_assistant_turn_and_a_tool_message(proxy, upstream):
    upstream.default = chat_only("It is sunny.")
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    ]
    assert proxy.client().responses.create(model="m", input=items).output_text == "It is sunny."
    assert upstream.requests[-1].json["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]


def test_a_stateful_responses_request_cannot_be_translated_and_says_so(start_proxy, upstream):
    upstream.default = chat_only()
    proxy = start_proxy(translate_apis="always")
    with pytest.raises(openai.BadRequestError) as raised:
        proxy.client().responses.create(model="m", input="And then?", previous_response_id="resp_1")
    assert "previous_response_id" in str(raised.value) and paths(upstream) == []


def test_where_the_upstream_speaks_responses_the_answer_is_its_own_byte_for_byte(proxy, upstream):
    native = answer("responses", "native answer")
    upstream.enqueue(native)
    reply = proxy.http.post("/v1/responses", json={"model": "m", "input": "Hello!"})
    assert reply.content == native.body and paths(upstream) == ["/v1/responses"]


def test_never_translating_passes_the_404_on(start_proxy, upstream):
    upstream.default = chat_only()
    proxy = start_proxy(translate_apis="never")
    reply = proxy.http.post("/v1/responses", json={"model": "m", "input": "Hello!"})
    assert reply.status_code == 404 and paths(upstream) == ["/v1/responses"]


def test_a_model_that_neither_path_knows_is_the_upstreams_404_and_is_not_remembered(proxy, upstream):
    upstream.default = lambda recorded: Reply(status=404, body=b'{"error": {"message": "model m not found"}}')
    first = proxy.http.post("/v1/responses", json={"model": "m", "input": "Hello!"})
    second = proxy.http.post("/v1/responses", json={"model": "m", "input": "Hello!"})
    assert first.status_code == second.status_code == 404 and "model m not found" in first.text
    assert paths(upstream) == ["/v1/responses", "/v1/chat/completions"] * 2


# -- Messages ----------------------------------------------------------------------------


def test_messages_are_translated_streamed_and_not(proxy, upstream):
    upstream.default = chat_only("Bonjour.")
    client = proxy.anthropic()
    asked = {"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}], "messages": [{"role": "user", "content": "Hello!"}]}

    whole = client.messages.create(**asked, stop_sequences=["END"])
    with client.messages.stream(**asked) as streamed:
        text = "".join(streamed.text_stream)
        final = streamed.get_final_message()

    assert whole.content[0].text == text == "Bonjour." and whole.stop_reason == final.stop_reason == "end_turn"
    assert (whole.usage.input_tokens, whole.usage.cache_read_input_tokens, whole.usage.output_tokens) == (13, 8, 5)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (13, 5)
    sent = upstream.requests[1].json
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    assert sent["max_tokens"] == 64 and "x-api-key" not in upstream.requests[1].headers
    assert upstream.requests[1].headers["authorization"] == "Bearer sk-ant-client"


@pytest.mark.parametrize("stream", [False, True])
def test_a_messages_tool_call_comes_back_as_tool_use(proxy, upstream, stream):
    upstream.default = chat_only(tool_calls=WEATHER_CALL)
    tools = [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    asked = {"model": "m", "max_tokens": 64, "tools": tools, "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    client = proxy.anthropic()
    if stream:
        with client.messages.stream(**asked) as streamed:
            message = streamed.get_final_message()
    else:
        message = client.messages.create(**asked)
    block = message.content[-1]
    assert (block.type, block.id, block.name, block.input) == ("tool_use", "call_1", "get_weather", {"city": "Paris"})
    assert message.stop_reason == "tool_use"
    assert upstream.requests[-1].json["tool_choice"] == "required"


def test_a_tool_result_becomes_a_tool_message_before_the_rest_of_its_turn(proxy, upstream):
    upstream.default = chat_only("Sunny.")
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "…", "signature": "x"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "And?"}],
        },
    ]
    proxy.anthropic().messages.create(model="m", max_tokens=32, messages=messages)
    assert upstream.requests[-1].json["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "And?"},
    ]


def test_a_chat_error_reaches_a_messages_client_in_anthropics_envelope(proxy, upstream):
    upstream.default = chat_only(status=400)
    with pytest.raises(anthropic.BadRequestError) as raised:
        proxy.anthropic().messages.create(model="m", max_tokens=32, messages=[{"role": "user", "content": "hi"}])
    assert raised.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: type must be number"}}


def test_a_chat_stream_cut_short_ends_the_translated_stream_in_an_error_event(proxy, upstream):
    cut = stream_reply(["Bon", "jour"])
    cut.chunks = cut.chunks[:2]  # no finish_reason, no [DONE]
    upstream.enqueue(Reply(status=404, body=b"{}"), cut)
    reply = proxy.http.post("/v1/messages", json={"model": "m", "max_tokens": 32, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert "event: error" in reply.text and "message_stop" not in reply.text


# -- protocol mode -----------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_protocol_mode_runs_on_a_chat_only_upstream(start_proxy, upstream, api, stream):
    upstream.default = chat_only("Your code is 5521.")
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, max_rounds=2)
    history = long_history()
    body = {"model": "m", "stream": stream}
    if api == "responses":
        body.update(instructions=history[0]["content"], input=history[1:])
    else:
        body.update(system=history[0]["content"], messages=history[1:], max_tokens=64)

    reply = proxy.http.post(f"/v1/{api}", json=body)

    assert reply.status_code == 200 and reply.headers["x-pcp-mode"] == "protocol"
    assert "5521" in reply.text and "PagedContext" not in reply.text
    workers = [r for r in upstream.requests if r.headers.get("x-pcp-role") == "worker"]
    assert workers[-1].path == "/v1/chat/completions" and "<PagedContext" in worker_document(workers[-1])
    assert api_of(workers[0]) == api or workers[0].path.endswith("/chat/completions")
