"""In protocol mode the client gets what the answering round said of itself: its finish reason,
its upstream headers, and usage only when asked for, once, over every round."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest

from proxy.testing.upstream import Recorded, Reply, completion, sse_chunks, stream_reply
from tests.proxy.helpers import long_history

from .test_protocol import summary_ids

USAGE = {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}
UPSTREAM_HEADERS = {"x-request-id": "req-answer", "x-ratelimit-remaining-requests": "41", "x-ratelimit-reset-tokens": "6ms", "openai-processing-ms": "120"}


class Locker(pydantic.BaseModel):
    code: str


def consult(stream: bool):
    def reply(recorded: Recorded) -> Reply:
        text = f'Consult("look closer", "{summary_ids(recorded)[0]}")'
        return (
            stream_reply([text], usage=USAGE, headers={"x-request-id": "req-consult"})
            if stream
            else completion(text, prompt_tokens=100, completion_tokens=7, headers={"x-request-id": "req-consult"})
        )

    return reply


# -- finish_reason -------------------------------------------------------------------


def test_a_streamed_answer_cut_by_max_tokens_raises_the_sdks_length_error(protocol_proxy, upstream):
    upstream.enqueue(stream_reply(['{"code": "55'], finish="length"))
    with (
        pytest.raises(openai.LengthFinishReasonError),
        protocol_proxy.client().chat.completions.stream(model="m", messages=long_history(), response_format=Locker, max_tokens=5) as stream,
    ):
        stream.until_done()


def test_an_answer_cut_by_max_tokens_raises_the_sdks_length_error(protocol_proxy, upstream):
    upstream.enqueue(completion('{"code": "55', finish="length"))
    with pytest.raises(openai.LengthFinishReasonError):
        protocol_proxy.client().chat.completions.parse(model="m", messages=long_history(), response_format=Locker, max_tokens=5)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("finish", ["stop", "length", "content_filter"])
def test_the_answering_rounds_finish_reason_is_relayed(protocol_proxy, upstream, stream, finish):
    answer = "Your locker code is 5521, as you told me a while ago; keep it to yourself at the gym."
    upstream.enqueue(consult(stream), stream_reply([answer], finish=finish) if stream else completion(answer, finish=finish))
    created = protocol_proxy.client().chat.completions.create(model="m", messages=long_history(), stream=stream)
    finishes = [c.choices[0].finish_reason for c in created if c.choices and c.choices[0].finish_reason] if stream else [created.choices[0].finish_reason]
    assert finishes == [finish]


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_tool_call_keeps_its_finish_reason(protocol_proxy, upstream, stream):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    if stream:
        delta = {"role": "assistant", "content": None, "tool_calls": [{"index": 0, **call}]}
        events = [
            f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', 'created': 0, 'model': 'm', 'choices': [{'index': 0, 'delta': d, 'finish_reason': f}]})}\n\n".encode()
            for d, f in ((delta, None), ({}, "tool_calls"))
        ]
        upstream.enqueue(Reply(headers={"content-type": "text/event-stream"}, chunks=[*events, b"data: [DONE]\n\n"]))
    else:
        upstream.enqueue(completion(tool_calls=[call]))
    created = protocol_proxy.client().chat.completions.create(model="m", messages=long_history(), tools=tools, stream=stream)
    finishes = [c.choices[0].finish_reason for c in created if c.choices and c.choices[0].finish_reason] if stream else [created.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


# -- usage -----------------------------------------------------------------------------


def _usage_events(response) -> list[dict]:
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return [event for event in events if event.get("usage")]


@pytest.mark.parametrize("ending", ["answer", "client_tool_call", "n_answers"])
def test_no_usage_chunk_unless_asked(protocol_proxy, upstream, ending):
    body = {"model": "m", "messages": long_history(), "stream": True}
    if ending == "answer":
        upstream.enqueue(consult(True), stream_reply(["Your locker code is 5521."], usage=USAGE))
    elif ending == "client_tool_call":
        body["tools"] = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        upstream.enqueue(_tool_call_stream())
    else:
        body["n"] = 2
        upstream.enqueue(completion("5521", n=2))

    response = protocol_proxy.http.post("/v1/chat/completions", json=body)

    assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol"
    assert _usage_events(response) == []


@pytest.mark.parametrize("ending", ["answer", "client_tool_call"])
def test_usage_when_asked_comes_once_the_answering_rounds(protocol_proxy, upstream, ending):
    body = {"model": "m", "messages": long_history(), "stream": True, "stream_options": {"include_usage": True}}
    if ending == "answer":
        upstream.enqueue(consult(True), stream_reply(["Your locker code is 5521."], usage=USAGE))
    else:
        body["tools"] = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        upstream.enqueue(consult(True), _tool_call_stream())

    response = protocol_proxy.http.post("/v1/chat/completions", json=body)

    usage = _usage_events(response)
    assert len(usage) == 1 and usage[0]["choices"] == []
    assert usage[0]["usage"] == USAGE  # the answering round's, not the sum with the Consult's
    data = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-2] == "data: " + json.dumps(usage[0]) and data[-1] == "data: [DONE]"  # last, as OpenAI sends it


def _tool_call_stream() -> Reply:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    events = sse_chunks([], usage=USAGE, finish="tool_calls")
    first = json.loads(events[0][6:])
    first["choices"][0]["delta"] = {"role": "assistant", "content": None, "tool_calls": [call]}
    return Reply(headers={"content-type": "text/event-stream"}, chunks=[f"data: {json.dumps(first)}\n\n".encode(), *events[1:]])


# -- upstream headers ----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_the_answering_rounds_upstream_headers_come_back(protocol_proxy, upstream, stream):
    answer = "Your locker code is 5521, as you told me a while ago; keep it to yourself at the gym."
    upstream.enqueue(consult(stream), stream_reply([answer], headers=UPSTREAM_HEADERS) if stream else completion(answer, headers=UPSTREAM_HEADERS))

    response = protocol_proxy.client().chat.completions.with_raw_response.create(model="m", messages=long_history(), stream=stream)
    created = response.parse()
    if stream:
        list(created)

    assert response.headers["x-pcp-mode"] == "protocol" and response.headers["x-pcp-rounds"] == "2"
    for name, value in UPSTREAM_HEADERS.items():
        assert response.headers[name] == value
    assert response.headers["content-type"].startswith("text/event-stream" if stream else "application/json")
    if not stream:
        assert created._request_id == "req-answer"


def test_the_upstreams_headers_never_override_the_proxys_own(protocol_proxy, upstream):
    upstream.enqueue(completion("5521", headers={"x-pcp-mode": "upstream", "x-pcp-rounds": "9", "content-length": "1", "x-request-id": "req-1"}))
    response = protocol_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()})
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "5521"
    assert (response.headers["x-pcp-mode"], response.headers["x-pcp-rounds"], response.headers["x-request-id"]) == ("protocol", "1", "req-1")
