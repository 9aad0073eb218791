"""Whatever a client or an upstream sends, the proxy answers in the envelope: never a 500 of its own, never a hang.

Property tests with hypothesis against the real proxy in protocol mode (a low
threshold, File blocks at 300 tokens), in front of the fake upstream. Requests
of every shape the JSON allows where the API expects messages, tools and
content parts; upstream answers of every shape where the proxy expects a
completion, a stream or directive tool calls. An upstream's own error status
is passed on as it came; what must not appear is the proxy's "internal proxy
error".
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.app import create_app
from proxy.settings import Settings
from proxy.testing.upstream import FakeUpstream, Recorded, Reply, completion, serve_in_thread, stream_reply

# The same 40 examples in every run; FUZZ_EXAMPLES=2000 searches further, with new ones each time.
SEARCH = os.environ.get("FUZZ_EXAMPLES")
EXAMPLES = settings(max_examples=int(SEARCH or 40), derandomize=SEARCH is None, deadline=None, suppress_health_check=list(HealthCheck))
INTERNAL = "internal proxy error"
FILLER = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} about gardens, budgets and the river trip number {i}"} for i in range(40)]

text = st.text(max_size=200) | st.sampled_from(
    [
        "[Session 1 - 1:56 pm on 8 May, 2023]\nhi",
        "<Node id='a'>",
        'Consult("a", "b")',
        "# Title\n\n" + "def f():\n    pass\n" * 80,  # a File block of source
        "word " * 700,
        "x" * 5000,  # one line longer than a page
    ]
)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", 3, None]), "text": json_value}) | json_value
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "weird"]), "content": text | st.lists(part, max_size=4) | json_value},
    optional={
        "name": json_value,
        "tool_calls": st.lists(
            st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": json_value, "arguments": json_value}) | json_value})
            | json_value,
            max_size=2,
        )
        | json_value,
        "timestamp": json_value,
    },
)
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": json_value}) | json_value}) | json_value


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


@pytest.fixture(scope="module")
def proxy_url(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings_ = Settings(
        upstream_base_url=upstream.url,
        data_dir=str(tmp_path_factory.mktemp("data")),
        router_embeddings=False,
        sentry_threshold=200,
        context_budget=700,
        max_rounds=3,
        block_tokens=300,
    )
    server = serve_in_thread(create_app(settings_))
    yield server.url
    server.stop()


def post(url: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", content=json.dumps(body), headers={"authorization": "Bearer k", **headers}, timeout=30)


@EXAMPLES
@given(
    messages=st.lists(message, max_size=5),
    long=st.booleans(),
    stream=st.booleans(),
    tools=tool | st.lists(tool, max_size=2),
    options=json_value,
    n=st.integers(-1, 3) | json_value,
    session=st.sampled_from([None, "s-1", "no spaces!"]),
)
def test_any_request_gets_an_answer_or_an_error_in_the_envelope(upstream, proxy_url, messages, long, stream, tools, options, n, session):
    upstream.default = lambda recorded: completion('Consult("x", "nowhere") and an answer', n=recorded.json.get("n") or 1)
    body = {"model": "m", "messages": (FILLER if long else []) + messages, "stream": stream, "tools": tools, "stream_options": options, "n": n}
    response = post(proxy_url, body, **({"x-pcp-session": session} if session else {}))
    assert INTERNAL not in response.text
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    elif stream:
        assert response.text.rstrip().endswith("data: [DONE]")


directive = st.sampled_from(
    ['Consult("a", "b")', "Consult(", 'Shelve("r", "x")', 'Explore("r", "history", "garden, river")', "Explore(r, history, )", "<PagedContext>", ""]
)
call = (
    st.fixed_dictionaries(
        {
            "id": st.text(max_size=4),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["pcp_consult", "pcp_explore", "pcp_shelve", "get_weather", "nope"]) | json_value,
                    "arguments": json_value | st.just('{"reason": "r", "handle": "history", "keywords": ["a", 1]}'),
                }
            )
            | json_value,
        }
    )
    | json_value
)
answer = st.builds(
    lambda message, usage: Reply(
        body=json.dumps(
            {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}
        ).encode()
    ),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": directive | json_value}, optional={"tool_calls": st.lists(call, max_size=2) | json_value}),
    json_value,
)
malformed = st.sampled_from(
    [
        Reply(body=b"not json"),
        Reply(body=b"[]"),
        Reply(body=b'{"choices": [{}]}'),
        Reply(status=500, body=b'{"error": {"message": "boom"}}'),
        Reply(headers={"content-type": "text/event-stream"}, chunks=[b'data: {"choices": [{"delta": {"content": 5}}]}\n\n']),
        Reply(
            headers={"content-type": "text/event-stream"},
            chunks=[
                b'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "pcp_consult", "arguments": "[1]"}}]}}]}\n\n',
                b"data: [DONE]\n\n",
            ],
        ),
    ]
)


@EXAMPLES
@given(
    replies=st.lists(st.lists(directive, max_size=3) | answer | malformed, max_size=4),
    stream=st.booleans(),
    channel_tools=st.booleans(),
    n=st.sampled_from([1, 2]),
)
def test_any_upstream_answer_ends_in_an_answer_or_an_error_in_the_envelope(upstream, proxy_url, replies, stream, channel_tools, n):
    script = list(replies)

    def reply(recorded: Recorded) -> Reply:
        scripted = script.pop(0) if script else "done"
        if isinstance(scripted, list):  # text pieces, streamed or not as the call asks
            return stream_reply(scripted) if recorded.json.get("stream") else completion("".join(scripted))
        return completion(scripted) if isinstance(scripted, str) else scripted

    upstream.default = reply
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}] if channel_tools else None
    response = post(
        proxy_url, {"model": "m", "messages": [*FILLER, {"role": "user", "content": "What about the river trip?"}], "stream": stream, "tools": tools, "n": n}
    )
    assert INTERNAL not in response.text
    if response.status_code >= 400:
        assert "error" in response.json()
    elif stream:
        body = response.text.rstrip()
        assert body.endswith("data: [DONE]") or '"error"' in body.rsplit("data: ", 1)[-1]
