"""The Responses API through the proxy, with the openai SDK's ``client.responses``: forwarded below the
threshold, paged above it, a function call's round trip in both."""

from __future__ import annotations

import json

import openai
import pytest

from proxy.testing.apis import api_requests, response, responses_stream, worker_text
from proxy.testing.upstream import Recorded, Reply
from tests.proxy.helpers import BUDGET, long_history

from .api_helpers import consult, document

QUESTION = {"role": "user", "content": "What is my gym locker code?"}
WEATHER = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def history_items() -> list[dict]:
    """``long_history`` as input items: the system prompt is the instructions; the assistant's turns as output messages."""
    items = []
    for m in long_history()[1:-1]:
        if m["role"] == "assistant":
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_{len(items)}",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": m["content"], "annotations": []}],
                }
            )
        else:
            items.append({"role": "user", "content": [{"type": "input_text", "text": m["content"]}]})
    return items


def workers(upstream) -> list[Recorded]:
    return api_requests(upstream, "responses", "worker")


# -- below the threshold, and what the proxy cannot see -----------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_short_conversation_goes_through_as_it_came(protocol_proxy, upstream, stream):
    upstream.enqueue(responses_stream(["Hel", "lo"]) if stream else response("Hello"))
    client = protocol_proxy.client()
    raw = client.responses.with_raw_response.create(model="m", instructions="Be brief.", input="hi", stream=stream)
    assert raw.headers["x-pcp-mode"] == "passthrough"
    sent = upstream.requests[-1]
    assert sent.path == "/v1/responses" and sent.json == {"model": "m", "instructions": "Be brief.", "input": "hi", "stream": stream}
    if stream:
        assert "".join(e.delta for e in raw.parse() if e.type == "response.output_text.delta") == "Hello"
    else:
        assert raw.parse().output_text == "Hello"


@pytest.mark.parametrize("state", [{"previous_response_id": "resp_1"}, {"conversation": "conv_1"}, {"background": True}])
def test_a_request_that_leans_on_state_the_proxy_cannot_see_goes_through_untouched(protocol_proxy, upstream, state):
    body = {"model": "m", "input": [*history_items(), QUESTION], **state}
    raw = json.dumps(body).encode()
    answer = protocol_proxy.http.post("/v1/responses", content=raw, headers={"content-type": "application/json"})
    assert answer.headers["x-pcp-mode"] == "passthrough"
    assert upstream.requests[-1].body == raw and not workers(upstream)


# -- paged -----------------------------------------------------------------------------


def test_a_long_conversation_is_paged_and_answered_as_one_response(protocol_proxy, upstream):
    upstream.enqueue(consult(False), response("Your locker code is 5521.", input_tokens=200, output_tokens=9, reasoning=True))
    client = protocol_proxy.client()

    raw = client.responses.with_raw_response.create(model="m", instructions="You are a friendly assistant.", input=[*history_items(), QUESTION], tools=WEATHER)
    answer = raw.parse()

    assert raw.headers["x-pcp-mode"] == "protocol" and raw.headers["x-pcp-rounds"] == "2"
    assert answer.output_text == "Your locker code is 5521."
    assert [item.type for item in answer.output] == ["message"]
    assert answer.instructions == "You are a friendly assistant." and [t.name for t in answer.tools] == ["get_weather"]
    # The answering call's usage: the context the answer was read from, which Codex measures its compaction by.
    assert (answer.usage.input_tokens, answer.usage.output_tokens, answer.usage.total_tokens) == (200, 9, 209)
    first, second = workers(upstream)
    assert first.json["tools"] == WEATHER and first.json["instructions"] == "You are a friendly assistant."
    (said,) = first.json["input"]
    assert said["role"] == "user" and worker_text(first).endswith("\n\nRespond to the Query of the PagedContext.")
    assert document(first).findtext("Query") == QUESTION["content"]
    assert document(second).find("Reasoning_Trace/Step").get("action") == "Consult"


def test_a_streamed_answer_is_the_event_stream_of_one_response_and_no_directive(protocol_proxy, upstream):
    upstream.enqueue(consult(True), responses_stream(["Your locker code ", "is 5521."], input_tokens=200, output_tokens=9))
    events = list(protocol_proxy.client().responses.create(model="m", input=[*history_items(), QUESTION], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Your locker code is 5521."
    completed = events[-1].response
    assert completed.output_text == "Your locker code is 5521." and completed.usage.input_tokens == 200
    assert all("Consult" not in json.dumps(e.model_dump()) for e in events)


def test_the_sdks_stream_helper_gets_the_final_response(protocol_proxy, upstream):
    upstream.enqueue(responses_stream(["The code is 5521, as you said on turn forty, and nobody else knows it."]))
    with protocol_proxy.client().responses.stream(model="m", input=[*history_items(), QUESTION]) as stream:
        final = stream.get_final_response()
    assert final.output_text.startswith("The code is 5521")


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_round_trip(protocol_proxy, upstream, stream):
    """The worker calls the client's tool: the call goes back as the upstream made it; the client runs it and
    sends the call and its output with the conversation; the worker reads them together and answers."""
    call = [("get_weather", {"city": "Oslo"})]
    upstream.enqueue(responses_stream(None, function_calls=call) if stream else response(None, function_calls=call, reasoning=True))
    client = protocol_proxy.client()
    asked = [*history_items(), {"role": "user", "content": "Weather in Oslo?"}]

    first = client.responses.create(model="m", input=asked, tools=WEATHER, stream=stream)
    output = [e.response for e in first if e.type == "response.completed"][0].output if stream else first.output
    made = [item for item in output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in made] == [("get_weather", {"city": "Oslo"})]

    upstream.enqueue(responses_stream(["It is 3 degrees and raining in Oslo."]) if stream else response("It is 3 degrees and raining in Oslo."))
    returned = [{"type": "function_call_output", "call_id": made[0].call_id, "output": "3 C, rain"}]
    again = client.responses.create(
        model="m", input=[*asked, *(item.model_dump(exclude_none=True) for item in output), *returned], tools=WEATHER, stream=stream
    )
    text = "".join(e.delta for e in again if e.type == "response.output_text.delta") if stream else again.output_text
    assert text == "It is 3 degrees and raining in Oslo."
    query = document(workers(upstream)[-1]).findtext("Query")
    assert query == '(calls get_weather({"city": "Oslo"})) (get_weather returned: 3 C, rain)'


def test_an_upstream_error_in_a_round_reaches_the_client(protocol_proxy, upstream):
    upstream.enqueue(Reply(status=429, body=b'{"error": {"message": "slow down", "type": "rate_limit", "param": null, "code": null}}'))
    with pytest.raises(openai.RateLimitError, match="slow down"):
        protocol_proxy.client().responses.create(model="m", input=[*history_items(), QUESTION])


def test_an_upstream_answer_that_is_no_response_is_502(protocol_proxy, upstream):
    upstream.enqueue(Reply(body=b'{"output": "nope"}'))
    answer = protocol_proxy.http.post("/v1/responses", json={"model": "m", "input": [*history_items(), QUESTION]})
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "upstream_bad_response"


def test_a_bad_request_is_a_400_that_names_the_field(protocol_proxy):
    answer = protocol_proxy.http.post("/v1/responses", json={"model": "m", "input": [1]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input.[0]"


def test_the_tools_channel_speaks_responses_function_tools(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=2 * BUDGET, directive_channel="tools")
    upstream.enqueue(response("5521"))
    proxy.client().responses.create(model="m", input=[*history_items(), QUESTION])
    tools = workers(upstream)[0].json["tools"]
    assert [(t["type"], t["name"], t["strict"]) for t in tools] == [
        ("function", "pcp_consult", False),
        ("function", "pcp_shelve", False),
        ("function", "pcp_explore", False),
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_round_trip_below_the_threshold_goes_through_as_it_came(protocol_proxy, upstream, stream):
    call = [("get_weather", {"city": "Oslo"})]
    upstream.enqueue(responses_stream(None, function_calls=call) if stream else response(None, function_calls=call))
    client = protocol_proxy.client()
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    first = client.responses.create(model="m", input=asked, tools=WEATHER, stream=stream)
    output = [e.response for e in first if e.type == "response.completed"][0].output if stream else first.output
    upstream.enqueue(response("3 degrees and rain."))
    returned = {"type": "function_call_output", "call_id": output[0].call_id, "output": "3 C, rain"}
    again = client.responses.with_raw_response.create(
        model="m", input=[*asked, *(item.model_dump(exclude_none=True) for item in output), returned], tools=WEATHER
    )
    assert again.headers["x-pcp-mode"] == "passthrough" and again.parse().output_text == "3 degrees and rain."
    assert upstream.requests[-1].json["input"][-1] == returned and not workers(upstream)
