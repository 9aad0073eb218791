"""Whatever a client or an upstream of the Responses or Messages API sends, the proxy answers in the API's
envelope: never a 500 of its own. Property tests, as ``test_robustness`` does for chat."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from proxy.testing.apis import PATHS, answer
from proxy.testing.upstream import Reply

# The proxy on loopback in front of the fake upstream, one for the module: test_robustness's.
from .test_robustness import EXAMPLES, FILLER, INTERNAL, json_value, proxy_url, text, upstream  # noqa: F401

kinds = st.sampled_from(
    [
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "web_search_call",
        "item_reference",
        "text",
        "input_text",
        "image",
        "tool_use",
        "tool_result",
        "thinking",
        "input_image",
        3,
        None,
    ]
)
block = (
    st.fixed_dictionaries(
        {"type": kinds},
        optional={
            "text": json_value,
            "content": json_value,
            "output": json_value,
            "input": json_value,
            "arguments": json_value,
            "name": json_value,
            "call_id": json_value,
            "id": json_value,
            "tool_use_id": json_value,
            "cache_control": json_value,
        },
    )
    | json_value
)
item = (
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]), "content": text | st.lists(block, max_size=4) | json_value}
    )
    | block
)
an_answer = st.dictionaries(
    st.sampled_from(["output", "content", "usage", "status", "stop_reason", "id"]), json_value | st.lists(block, max_size=3), max_size=4
)
event = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            [
                "response.created",
                "response.output_text.delta",
                "response.output_item.added",
                "response.completed",
                "error",
                "message_start",
                "content_block_start",
                "content_block_delta",
                "message_delta",
                "message_stop",
                7,
            ]
        )
    },
    optional={
        "delta": json_value,
        "item": json_value,
        "response": json_value,
        "message": json_value,
        "content_block": json_value,
        "usage": json_value,
        "index": json_value,
        "output_index": json_value,
    },
)


def request(api: str, items: list[Any], long: bool, stream: bool) -> dict[str, Any]:
    history = FILLER if long else []
    if api == "responses":
        return {"model": "m", "input": [*history, *items], "stream": stream, "instructions": "be kind"}
    return {"model": "m", "max_tokens": 9, "messages": [*history, *items], "stream": stream, "system": [{"type": "text", "text": "be kind"}]}


def post(url: str, api: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1{PATHS[api]}", content=json.dumps(body), headers={"authorization": "Bearer k"}, timeout=30)


def envelope_or_answer(api: str, response: httpx.Response) -> None:
    assert INTERNAL not in response.text, response.text
    if response.status_code >= 400 and api == "messages":
        assert response.json()["type"] == "error", response.text


@EXAMPLES
@given(api=st.sampled_from(["responses", "messages"]), items=st.lists(item, max_size=5), long=st.booleans(), stream=st.booleans())
def test_any_request_gets_an_answer_or_an_error_in_the_apis_envelope(upstream, proxy_url, api, items, long, stream):
    upstream.script.clear()
    upstream.default = lambda recorded: answer(api, 'Consult("x", "nowhere") and an answer', stream=stream)
    envelope_or_answer(api, post(proxy_url, api, request(api, items, long, stream)))


@EXAMPLES
@given(api=st.sampled_from(["responses", "messages"]), body=an_answer, events=st.lists(event, max_size=5), stream=st.booleans())
def test_any_upstream_answer_is_read_or_a_502(upstream, proxy_url, api, body, events, stream):
    chunks = [f"event: x\ndata: {json.dumps(e)}\n\n".encode() for e in events]
    reply = Reply(headers={"content-type": "text/event-stream"}, chunks=chunks) if stream else Reply(body=json.dumps(body).encode())
    upstream.script.clear()
    upstream.default = lambda recorded: reply
    response = post(proxy_url, api, request(api, [{"role": "user", "content": "What now?"}], True, stream))
    envelope_or_answer(api, response)
