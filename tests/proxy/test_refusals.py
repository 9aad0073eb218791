"""A model whose window is smaller than the proxy knew: the upstream's refusal of a prompt as too long is read in each
server's words, the window it names is learned, and the request is paged within it, never shown to the client."""

from __future__ import annotations

import json

import pytest

from proxy.protocol.refusals import Refusal, refused_window
from proxy.testing.replies import Recorded, Reply
from proxy.testing.upstream import completion

OPENAI = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
VLLM = {
    "object": "error",
    "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).",
    "type": "BadRequestError",
    "code": 400,
}
ANTHROPIC = {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"}}
LLAMA_CPP = {
    "error": {
        "code": 400,
        "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5000,
        "n_ctx": 4096,
    }
}
UNNAMED = {
    "error": {
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        (OPENAI, Refusal(8192, 9000)),
        (VLLM, Refusal(4096, 5000)),
        (ANTHROPIC, Refusal(200_000, 208_310)),
        (LLAMA_CPP, Refusal(4096, 5000)),
        (UNNAMED, Refusal()),
    ],
)
def test_each_servers_refusal_of_a_prompt_too_long_is_read(body, refusal):
    assert refused_window(json.dumps(body).encode()) == refusal


@pytest.mark.parametrize(
    "body",
    [{"error": {"message": "Invalid value for 'temperature'", "type": "invalid_request_error"}}, {"type": "error", "error": {"type": "overloaded_error"}}],
)
def test_another_refusal_is_not_one(body):
    assert refused_window(json.dumps(body).encode()) is None


def test_the_window_is_taken_into_the_proxys_own_count():
    # The upstream counted 9,000 tokens where the proxy counts 7,200: its 8,192 are the proxy's 6,553.
    assert Refusal(8192, 9000).in_our_count(7200) == 8192 * 7200 // 9000
    assert Refusal(8192).in_our_count(9000) == 8192  # its count not said: the window as named
    assert Refusal().in_our_count(9000) == 8100  # no window said: a tenth less than the prompt it refused


def _windowed(window: int):
    """An upstream whose model refuses a prompt longer than ``window`` (a rough count: 4 characters a token), as OpenAI does."""

    def reply(recorded: Recorded) -> Reply:
        tokens = len(recorded.body) // 4
        if tokens > window:
            body = {
                **OPENAI["error"],
                "message": f"This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens.",
            }
            return Reply(status=400, body=json.dumps({"error": body}).encode())
        return completion("the shed")

    return reply


def _chat(turns: int) -> list[dict[str, str]]:
    said = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Line {i} of a long chat about the gardens of the old town, and a shed."}
        for i in range(turns)
    ]
    return [*said, {"role": "user", "content": "Where is the shed?"}]


def test_a_prompt_refused_as_too_long_is_paged_within_the_window_it_names(start_proxy, upstream):
    proxy = start_proxy()  # at the defaults: a claude-* model's window is known as 200k
    upstream.default = _windowed(3000)
    first = proxy.http.post("/v1/chat/completions", json={"model": "claude-sonnet-4-5", "messages": _chat(301)})
    assert first.status_code == 200 and first.headers["x-pcp-mode"] == "protocol", first.text
    assert first.headers["x-pcp-mode-reason"] == "refused-untouched"
    assert first.json()["choices"][0]["message"]["content"] == "the shed"
    sent = upstream.chat_requests()
    assert len(sent) == 2 and len(sent[0].body) // 4 > 3000 >= len(sent[1].body) // 4  # refused untouched, then paged within it
    later = proxy.http.post("/v1/chat/completions", json={"model": "claude-sonnet-4-5", "messages": _chat(321)})
    assert later.status_code == 200 and later.headers["x-pcp-mode"] == "protocol"
    assert len(upstream.chat_requests()) == 3  # learned: paged at once, no refusal first


def test_a_request_that_turns_paging_off_gets_the_refusal_as_it_came(start_proxy, upstream):
    proxy = start_proxy()
    upstream.default = _windowed(3000)
    response = proxy.http.post("/v1/chat/completions", json={"model": "claude-sonnet-4-5", "messages": _chat(301)}, headers={"x-pcp-mode-request": "off"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert len(upstream.chat_requests()) == 1


def test_a_refusal_a_page_cannot_cure_is_a_413_that_says_so(start_proxy, upstream):
    proxy = start_proxy()
    upstream.default = _windowed(300)  # smaller than the paged frame itself
    response = proxy.http.post("/v1/chat/completions", json={"model": "claude-sonnet-4-5", "messages": _chat(301)})
    assert response.status_code == 413 and "context window" in response.json()["error"]["message"], response.text
