"""Numbers no JSON decoder reads as numbers (``1e999``: infinite as a double): a 400 naming the field in every paged API
and mode, before anything goes upstream; and from the upstream, never written back to the client as ``Infinity``."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from proxy.testing.apis import PATHS
from proxy.testing.upstream import Reply, completion, stream_reply

HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} about gardens and the river trip {i}"} for i in range(60)]
MODES = {"passthrough": 1_000_000, "protocol": 200}
MARK = 0.123456789  # a number in the request, spliced with the number under test


def raw_body(api: str, number: bytes, *, stream: bool = False, where: str = "temperature") -> bytes:
    """A request of ``api`` long enough to be paged, with ``number`` spliced in at ``where``: ``temperature``, a tool's
    schema (``tool``), or a message's own field (``message``)."""
    messages = [*HISTORY, {"role": "user", "content": "what about the river?", **({"weight": MARK} if where == "message" else {})}]
    schema = {"type": "object", "properties": {"n": {"type": "number", "maximum": MARK if where == "tool" else 10}}}
    body: dict[str, Any]
    if api == "responses":
        body = {"model": "m", "input": messages, "tools": [{"type": "function", "name": "f", "parameters": schema}]}
    elif api == "messages":
        body = {"model": "m", "max_tokens": 100, "messages": messages, "tools": [{"name": "f", "input_schema": schema}]}
    else:
        body = {"model": "m", "messages": messages, "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
    body.update(temperature=MARK if where == "temperature" else 0.5, stream=stream)
    encoded = json.dumps(body).encode()
    assert encoded.count(str(MARK).encode()) == 1
    return encoded.replace(str(MARK).encode(), number)


def post(proxy, api: str, content: bytes):
    said = {"x-api-key": "k", "anthropic-version": "2023-06-01"} if api == "messages" else {"authorization": "Bearer k"}
    headers = {"content-type": "application/json", **said}
    return proxy.http.post(f"/v1{PATHS[api]}", content=content, headers=headers)


def refused(response, api: str) -> tuple[str | None, str]:
    """The 400's ``param`` (None in Anthropic's envelope, which has none) and message, its envelope the API's own."""
    assert response.status_code == 400, response.text
    said = response.json()
    if api == "messages":
        assert said["type"] == "error" and said["error"]["type"] == "invalid_request_error"
        return None, said["error"]["message"]
    error = said["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "number_out_of_range"
    return error["param"], error["message"]


@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"1E+400"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("api", list(PATHS))
def test_an_infinite_temperature_is_a_400_naming_it_and_nothing_goes_upstream(start_proxy, upstream, api, mode, stream, number):
    proxy = start_proxy(sentry_threshold=MODES[mode], context_budget=700)
    response = post(proxy, api, raw_body(api, number, stream=stream))
    param, message = refused(response, api)
    assert param in ("temperature", None) and "`temperature`" in message and number.decode() in message
    assert upstream.requests == []


@pytest.mark.parametrize("where, param", [("tool", "tools.[0].{schema}.properties.n.maximum"), ("message", "{messages}.[60].weight")])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("api", list(PATHS))
def test_an_infinite_number_deep_in_the_body_is_a_400_naming_where(start_proxy, upstream, api, mode, where, param):
    proxy = start_proxy(sentry_threshold=MODES[mode], context_budget=700)
    schema = {"chat": "function.parameters", "responses": "parameters", "messages": "input_schema"}[api]
    expected = param.format(schema=schema, messages="input" if api == "responses" else "messages")
    named, message = refused(post(proxy, api, raw_body(api, b"1e999", where=where)), api)
    assert named in (expected, None) and f"`{expected}`" in message
    assert upstream.requests == []


@pytest.mark.parametrize("number", [b"1e-999", b"-0", b"123456789012345678901234567890", b"1.7976931348623157e308"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_number_within_range_goes_upstream_as_sent(start_proxy, upstream, mode, number):
    proxy = start_proxy(sentry_threshold=MODES[mode], context_budget=700)
    response = post(proxy, "chat", raw_body("chat", number))
    assert response.status_code == 200, response.text
    assert re.search(rb'"temperature": ?' + re.escape(number) + rb"[,}]", upstream.chat_requests()[-1].body)


def _with_huge_usage(reply: Reply) -> Reply:
    """``reply`` with its usage's prompt tokens written as 1e999 (in its body, or in the chunk that carries it)."""
    if reply.chunks:
        return Reply(headers=reply.headers, chunks=[chunk.replace(b'"prompt_tokens": 10', b'"prompt_tokens": 1e999') for chunk in reply.chunks])
    return Reply(headers=reply.headers, body=reply.body.replace(b'"prompt_tokens": 10', b'"prompt_tokens": 1e999'))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("api", ["responses", "messages"])
def test_an_infinite_number_in_a_translated_answer_is_never_written_back_as_infinity(start_proxy, upstream, api, mode, stream):
    """A chat upstream's answer that says 1e999, translated to the client's API: an error the client can read, not ``Infinity``."""
    proxy = start_proxy(sentry_threshold=MODES[mode], context_budget=700, translate_apis="always")
    usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    reply = stream_reply(["fine"], usage=usage) if stream else completion("fine", prompt_tokens=10, completion_tokens=2)
    upstream.default = lambda _: _with_huge_usage(reply)
    response = post(proxy, api, raw_body(api, b"0.5", stream=stream))
    assert b"Infinity" not in response.content and b"NaN" not in response.content
    if response.status_code == 502:
        json.loads(response.content, parse_constant=_refused)
    else:  # the stream had begun: it ends with the API's error event
        assert stream and response.status_code == 200 and b"error" in response.content, response.text
        for line in response.content.splitlines():
            if line.startswith(b"data:"):
                json.loads(line[5:], parse_constant=_refused)


def test_a_tool_calls_arguments_that_say_nan_reach_a_messages_client_as_text(start_proxy, upstream):
    proxy = start_proxy(translate_apis="always")
    upstream.default = lambda _: completion(None, tool_calls=[{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"n": NaN}'}}])
    response = post(proxy, "messages", raw_body("messages", b"0.5"))
    assert response.status_code == 200, response.text
    (call,) = [block for block in json.loads(response.content, parse_constant=_refused)["content"] if block["type"] == "tool_use"]
    assert call["input"] == {"input": '{"n": NaN}'}


def _refused(constant: str) -> None:
    raise AssertionError(f"the proxy wrote {constant}, which is not JSON")
