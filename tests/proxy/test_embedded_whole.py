"""A chat completion asked whole of the embedded server goes to it as a stream, and is put together again."""

from __future__ import annotations

import asyncio
import json

import httpx

from proxy.embedded.whole import assembled, streamed_request


def sse(*chunks: dict) -> httpx.Response:
    body = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=httpx.ByteStream(body))


def test_a_whole_answer_is_asked_for_as_a_stream_with_its_usage():
    asked = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions", json={"model": "m", "messages": [], "max_tokens": 5})
    sent = json.loads(streamed_request(asked).content)
    assert sent == {"model": "m", "messages": [], "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    for untouched in ({"stream": True}, {"n": 2}):
        assert streamed_request(httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions", json={"messages": [], **untouched})) is None
    assert streamed_request(httpx.Request("POST", "http://127.0.0.1:1/v1/completions", json={"prompt": "x"})) is None


def test_text_tool_calls_and_usage_are_put_together():
    meta = {"id": "c1", "created": 7, "model": "smol", "object": "chat.completion.chunk"}
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"ci'}}
    response = sse(
        {**meta, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]},
        {**meta, "choices": [{"index": 0, "delta": {"content": "check."}}]},
        {**meta, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {**meta, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}}]},
        {**meta, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {**meta, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}},
    )
    status, body = asyncio.run(assembled(response))
    completion = json.loads(body)
    assert status == 200 and (completion["id"], completion["model"], completion["object"]) == ("c1", "smol", "chat.completion")
    message = completion["choices"][0]["message"]
    assert message["content"] == "Let me check." and completion["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"] == [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    assert completion["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}


def test_a_stream_that_stops_short_or_fails_is_an_error():
    cut = httpx.Response(200, stream=httpx.ByteStream(b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'))
    assert asyncio.run(assembled(cut))[0] == 502
    failed = sse({"error": {"message": "out of memory", "type": "server_error"}})
    status, body = asyncio.run(assembled(failed))
    assert status == 500 and json.loads(body)["error"]["message"] == "out of memory"
