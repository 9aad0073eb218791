"""Every field of the Responses and Messages APIs on an upstream that speaks only chat completions: carried as chat
carries it, or refused with a 400 that names it. Driven by the official openai and anthropic SDKs."""

from __future__ import annotations

import json
import re

import anthropic
import openai
import pydantic
import pytest

from proxy.testing.upstream import Recorded, Reply, completion, stream_reply

from .helpers import BUDGET, long_history


class Weather(pydantic.BaseModel):
    city: str
    celsius: int


def chat_answering(text: str, **kwargs):
    """A chat-only upstream (its /responses and /messages a 404) that answers ``text``, streamed or not."""

    def reply(recorded: Recorded) -> Reply:
        if not recorded.path.endswith("/chat/completions"):
            return Reply(status=404, body=b'{"detail": "Not Found"}')
        if recorded.json.get("stream"):
            return stream_reply(
                [text[: len(text) // 2], text[len(text) // 2 :]], usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}, **kwargs
            )
        return completion(text, prompt_tokens=9, completion_tokens=4, **kwargs)

    return reply


def chat_sent(upstream) -> dict:
    return [r for r in upstream.requests if r.path.endswith("/chat/completions")][-1].json


# -- structured output -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_structured_output_goes_as_a_json_schema_and_the_sdk_parses_the_answer(proxy, upstream, stream):
    upstream.default = chat_answering('{"city": "Paris", "celsius": 21}')
    client = proxy.anthropic()
    asked = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Weather in Paris?"}], "output_format": Weather}
    if stream:
        with client.messages.stream(**asked) as streamed:
            parsed = streamed.get_final_message().parsed_output
    else:
        parsed = client.messages.parse(**asked).parsed_output
    assert parsed == Weather(city="Paris", celsius=21)
    format = chat_sent(upstream)["response_format"]
    assert format["type"] == "json_schema" and format["json_schema"]["name"] == "output"
    assert set(format["json_schema"]["schema"]["properties"]) == {"city", "celsius"}


def test_anthropic_output_config_format_as_a_dict_goes_as_a_json_schema(proxy, upstream):
    upstream.default = chat_answering('{"ok": true}')
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    message = proxy.anthropic().messages.create(
        model="m", max_tokens=64, messages=[{"role": "user", "content": "ok?"}], output_config={"format": {"type": "json_schema", "schema": schema}}
    )
    assert json.loads(message.content[0].text) == {"ok": True}
    assert chat_sent(upstream)["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


# -- stop sequences ----------------------------------------------------------------------


def chat_streaming(pieces: list[str], **kwargs):
    """A chat-only upstream that answers with a stream of ``pieces`` (the proxy asks for one where it watches stops)."""

    def reply(recorded: Recorded) -> Reply:
        if not recorded.path.endswith("/chat/completions"):
            return Reply(status=404, body=b'{"detail": "Not Found"}')
        assert recorded.json["stream"] is True
        return stream_reply(pieces, usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}, **kwargs)

    return reply


def _answered(client, asked: dict, stream: bool):
    """The text the SDK hands its caller, and the message, streamed or not."""
    if stream:
        with client.messages.stream(**asked) as streamed:
            return "".join(streamed.text_stream), streamed.get_final_message()
    message = client.messages.create(**asked)
    return message.content[0].text, message


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_ends_the_message_with_its_stop_reason_and_names_it(proxy, upstream, stream):
    upstream.default = chat_streaming(["Un, deux, trois. E", "ND and then more ", "STOP"])
    asked = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Count."}], "stop_sequences": ["STOP", "END"]}
    text, message = _answered(proxy.anthropic(), asked, stream)
    assert text == message.content[0].text == "Un, deux, trois. "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    assert "stop" not in chat_sent(upstream)  # the proxy watches for them: a chat upstream would not say which fired


@pytest.mark.parametrize("stream", [False, True])
def test_a_text_that_only_begins_a_stop_sequence_is_all_said_and_ends_the_turn(proxy, upstream, stream):
    upstream.default = chat_streaming(["It is the E", "N"])
    asked = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Say it."}], "stop_sequences": ["END"]}
    text, message = _answered(proxy.anthropic(), asked, stream)
    assert text == message.content[0].text == "It is the EN"
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (9, 4)


def test_stop_sequences_that_are_not_strings_are_refused_by_name(proxy, upstream):
    upstream.default = chat_streaming(["x"])
    reply = proxy.http.post("/v1/messages", json={"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": "END"})
    assert reply.status_code == 400 and "stop_sequences" in reply.text


@pytest.mark.parametrize("step", [1, 2, 5, 100])
def test_stops_release_what_cannot_begin_a_sequence_whole_or_a_character_at_a_time(step):
    from proxy.apis.stops import Stops

    text = "a <b> ab <stop> after"
    stops = Stops(["<stop>", "<sto", "zz"])
    said = "".join(stops.feed(text[i : i + step]) for i in range(0, len(text), step))
    assert (said, stops.fired) == ("a <b> ab ", "<sto")  # the sequence that completes first
    stops = Stops(["zz", "abc"])
    said = "".join(stops.feed(text[i : i + step]) for i in range(0, len(text), step)) + stops.flush()
    assert (said, stops.fired) == (text, None)


# -- images inside tool results ----------------------------------------------------------

PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
SCREENSHOT = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}


def test_a_responses_function_call_output_with_an_image_sends_the_image_after_the_tool_messages(proxy, upstream):
    upstream.default = chat_answering("A login form.")
    call = {"type": "function_call", "name": "screenshot", "arguments": "{}"}
    items = [
        {"role": "user", "content": "What is on screen?"},
        {**call, "call_id": "call_1"},
        {**call, "call_id": "call_2"},
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": [{"type": "input_text", "text": "captured"}, {"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL}"}],
        },
        {"type": "function_call_output", "call_id": "call_2", "output": "no second screen"},
    ]
    assert proxy.client().responses.create(model="m", input=items).output_text == "A login form."
    sent = chat_sent(upstream)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
    assert (sent[2]["content"], sent[3]["content"]) == ("captured", "no second screen")
    assert sent[4]["content"][1:] == [SCREENSHOT] and "call_1" in sent[4]["content"][0]["text"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_messages_tool_result_with_an_image_sends_the_image_in_the_user_message_after_it(proxy, upstream, stream):
    upstream.default = chat_answering("A login form.")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}
    messages = [
        {"role": "user", "content": "What is on screen?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "captured"}, image]},
                {"type": "text", "text": "Well?"},
            ],
        },
    ]
    client = proxy.anthropic()
    if stream:
        with client.messages.stream(model="m", max_tokens=32, messages=messages) as streamed:
            text = streamed.get_final_message().content[0].text
    else:
        text = client.messages.create(model="m", max_tokens=32, messages=messages).content[0].text
    assert text == "A login form."
    sent = chat_sent(upstream)["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "captured"}
    assert sent[3]["content"][1:] == [SCREENSHOT, {"type": "text", "text": "Well?"}] and "toolu_1" in sent[3]["content"][0]["text"]


# -- store and metadata ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("store", [True, False, None])
def test_responses_store_and_metadata_go_to_chat_and_the_answer_says_what_was_asked(proxy, upstream, stream, store):
    upstream.default = chat_answering("Noted.")
    client = proxy.client()
    asked = {"model": "m", "input": "Remember this.", "metadata": {"ticket": "T-42"}, **({} if store is None else {"store": store})}
    if stream:
        with client.responses.stream(**asked) as streamed:
            response = streamed.get_final_response()
    else:
        response = client.responses.create(**asked)
    assert response.output_text == "Noted." and response.store is bool(store) and response.metadata == {"ticket": "T-42"}
    sent = chat_sent(upstream)
    assert sent["metadata"] == {"ticket": "T-42"} and sent.get("store") == store


# -- protocol mode: the answer in the user's characters ----------------------------------

SAID = 'Gina: I love you <3 & "always" -- 5 > 4, and &lt; is how HTML writes it.'


def quoting_upstream(recorded: Recorded) -> Reply:
    """A chat-only upstream whose model quotes the prompt's line about Gina back, as it read it (escaped)."""
    if not recorded.path.endswith("/chat/completions"):
        return Reply(status=404, body=b'{"detail": "Not Found"}')
    found = re.search(r"Gina:[^<\n]*?HTML writes it\.", _texts(recorded.json["messages"]))
    text = f"You told me: {found.group() if found else 'nothing'}"
    if recorded.json.get("stream"):
        return stream_reply([text[:20], text[20:37], text[37:]], usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13})
    return completion(text)


def _texts(messages: list) -> str:
    return "\n".join(m["content"] if isinstance(m["content"], str) else " ".join(p.get("text", "") for p in m["content"]) for m in messages if m.get("content"))


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_quoting_the_paged_conversation_carries_no_entity_the_conversation_did_not(start_proxy, upstream, api, stream):
    upstream.default = quoting_upstream
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, max_rounds=1)
    history = long_history()
    history[-3]["content"] = SAID
    history[-1]["content"] = "What did Gina say?"
    if api == "chat":
        said = proxy.client().chat.completions.create(model="m", messages=history, stream=stream)
        text = "".join(c.choices[0].delta.content or "" for c in said if c.choices) if stream else said.choices[0].message.content
    elif api == "responses":
        said = proxy.client().responses.create(model="m", instructions=history[0]["content"], input=history[1:], stream=stream)
        text = "".join(e.delta for e in said if e.type == "response.output_text.delta") if stream else said.output_text
    else:
        client = proxy.anthropic()
        asked = {"model": "m", "max_tokens": 64, "system": history[0]["content"], "messages": history[1:]}
        if stream:
            with client.messages.stream(**asked) as streamed:
                text = "".join(streamed.text_stream)
        else:
            text = client.messages.create(**asked).content[0].text
    workers = [r for r in upstream.requests if r.path.endswith("/chat/completions") and r.headers.get("x-pcp-role") == "worker"]
    assert workers and "&lt;3 &amp;" in _texts(workers[-1].json["messages"])  # the document escaped it
    assert text == f"You told me: {SAID}"


# -- which fronts are native -------------------------------------------------------------


def partial_responses(server: str | None):
    """An upstream with a Responses endpoint of its own, as llama.cpp's: its stream's events numbered null, an
    earlier assistant message in the input a 400; its chat completions whole."""
    named = {"server": server} if server else {}

    def reply(recorded: Recorded) -> Reply:
        if recorded.path.endswith("/chat/completions"):
            answered = chat_answering("Bonjour.")(recorded)
            answered.headers.update(named)
            return answered
        if any(isinstance(item, dict) and item.get("role") == "assistant" for item in recorded.json.get("input") or ()):
            return Reply(status=400, body=b'{"error": {"message": "Cannot determine type of item"}}', headers={"content-type": "application/json", **named})
        created = {"type": "response.created", "sequence_number": None, "response": {"id": "resp_1", "object": "response", "output": []}}
        return Reply(headers={"content-type": "text/event-stream", **named}, chunks=[f"event: response.created\ndata: {json.dumps(created)}\n\n".encode()])

    return reply


@pytest.mark.parametrize("server", ["llama.cpp", None])
def test_a_partial_responses_front_is_translated_and_healthz_says_so(proxy, upstream, server):
    upstream.default = partial_responses(server)
    client = proxy.client()
    with client.responses.stream(model="m", input="Hello!") as streamed:
        first = streamed.get_final_response()
    items = [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Bonjour."}]},
        {"role": "user", "content": "Again?"},
    ]
    second = client.responses.create(model="m", input=items)
    assert first.output_text == second.output_text == "Bonjour."
    paths = [r.path for r in upstream.requests]
    assert paths == ["/v1/responses", "/v1/chat/completions", "/v1/chat/completions"]  # the own endpoint tried once, then never
    said = proxy.http.get("/healthz").json()["apis"]
    assert said["responses"].startswith("translated") and said["messages"].startswith("native")


def test_a_front_that_speaks_the_api_stays_native(proxy, upstream):
    with proxy.client().responses.stream(model="m", input="Hello!") as streamed:
        streamed.get_final_response()
    assert [r.path for r in upstream.requests] == ["/v1/responses"]
    assert proxy.http.get("/healthz").json()["apis"]["responses"] == "native"


def test_llama_cpps_own_responses_is_never_used_even_for_its_first_answer_an_error(proxy, upstream):
    upstream.default = partial_responses("llama.cpp")
    items = [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Bonjour."}]},
        {"role": "user", "content": "Again?"},
    ]
    assert proxy.client().responses.create(model="m", input=items).output_text == "Bonjour."
    assert [r.path for r in upstream.requests] == ["/v1/responses", "/v1/chat/completions"]


# -- refused by name, never dropped --------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("tools", [{"type": "web_search"}], "tools[0]"),
        ("truncation", "auto", "truncation"),
        ("max_tool_calls", 3, "max_tool_calls"),
        ("context_management", [{"type": "compaction"}], "context_management"),
    ],
)
def test_a_responses_field_a_chat_upstream_cannot_be_asked_is_a_400_that_names_it(start_proxy, upstream, field, value, named):
    upstream.default = chat_answering("x")
    proxy = start_proxy(translate_apis="always")
    with pytest.raises(openai.BadRequestError) as raised:
        proxy.client().responses.create(model="m", input="hi", extra_body={field: value})
    assert raised.value.body["param"] == named and not upstream.requests


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("tools", [{"type": "web_search_20250305", "name": "web_search"}], "tools.0"),
        ("container", "c_1", "container"),
        ("mcp_servers", [{"type": "url"}], "mcp_servers"),
    ],
)
def test_a_messages_field_a_chat_upstream_cannot_be_asked_is_a_400_that_names_it(start_proxy, upstream, field, value, named):
    upstream.default = chat_answering("x")
    proxy = start_proxy(translate_apis="always")
    with pytest.raises(anthropic.BadRequestError) as raised:
        proxy.anthropic().messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": "hi"}], extra_body={field: value})
    assert named in str(raised.value) and not upstream.requests


def test_reasoning_effort_and_verbosity_are_carried_as_chats(proxy, upstream):
    upstream.default = chat_answering("x")
    proxy.client().responses.create(model="m", input="hi", reasoning={"effort": "low"}, text={"verbosity": "low"})
    assert (chat_sent(upstream)["reasoning_effort"], chat_sent(upstream)["verbosity"]) == ("low", "low")
    proxy.anthropic().messages.create(
        model="m", max_tokens=9, messages=[{"role": "user", "content": "hi"}], thinking={"type": "enabled", "budget_tokens": 2048}
    )
    assert chat_sent(upstream)["reasoning_effort"] == "low"
    proxy.anthropic().messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": "hi"}], output_config={"effort": "max"})
    assert chat_sent(upstream)["reasoning_effort"] == "xhigh"


# -- the same in protocol mode -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_in_protocol_mode_a_stop_sequence_and_structured_output_reach_the_messages_client(start_proxy, upstream, stream):
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, max_rounds=1)
    history = long_history()
    asked = {"model": "m", "max_tokens": 64, "system": history[0]["content"], "messages": history[1:]}
    client = proxy.anthropic()

    upstream.default = chat_streaming(["Your code is 5521. E", "ND and then more"])
    if stream:
        with client.messages.stream(**asked, stop_sequences=["END"]) as streamed:
            message = streamed.get_final_message()
    else:
        message = client.messages.create(**asked, stop_sequences=["END"])
    assert message.content[0].text.strip() == "Your code is 5521." and (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")

    upstream.default = chat_streaming(['{"city": "Paris", "celsius": 21}']) if stream else chat_answering('{"city": "Paris", "celsius": 21}')
    if stream:
        with client.messages.stream(**asked, output_format=Weather) as streamed:
            parsed = streamed.get_final_message().parsed_output
    else:
        parsed = client.messages.parse(**asked, output_format=Weather).parsed_output
    assert parsed == Weather(city="Paris", celsius=21)
    workers = [r for r in upstream.requests if r.path.endswith("/chat/completions") and r.headers.get("x-pcp-role") == "worker"]
    assert workers[-1].json["response_format"]["type"] == "json_schema" and "<PagedContext" in _texts(workers[-1].json["messages"])


@pytest.mark.parametrize("stream", [False, True])
def test_in_protocol_mode_store_and_metadata_reach_the_chat_upstream_and_come_back(start_proxy, upstream, stream):
    upstream.default = chat_answering("Your code is 5521.")
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, max_rounds=1)
    history = long_history()
    asked = {"model": "m", "instructions": history[0]["content"], "input": history[1:], "store": True, "metadata": {"ticket": "T-42"}}
    if stream:
        with proxy.client().responses.stream(**asked) as streamed:
            response = streamed.get_final_response()
    else:
        response = proxy.client().responses.create(**asked)
    assert "5521" in response.output_text and response.store is True and response.metadata == {"ticket": "T-42"}
    workers = [r for r in upstream.requests if r.path.endswith("/chat/completions") and r.headers.get("x-pcp-role") == "worker"]
    assert (workers[-1].json["store"], workers[-1].json["metadata"]) == (True, {"ticket": "T-42"})


@pytest.mark.parametrize("stream", [False, True])
def test_ollamas_own_responses_is_known_by_its_ids_and_translated(proxy, upstream, stream):
    def ollama(recorded: Recorded) -> Reply:
        if recorded.path.endswith("/chat/completions"):
            return chat_answering("Bonjour.")(recorded)
        response = {
            "id": "resp_482913",
            "object": "response",
            "status": "completed",
            "output": [],
            "tool_choice": "auto",
            "metadata": {},
            "service_tier": "default",
        }
        if not recorded.json.get("stream"):
            return Reply(body=json.dumps(response).encode())
        created = {"type": "response.created", "sequence_number": 0, "response": response}
        return Reply(headers={"content-type": "text/event-stream"}, chunks=[f"event: response.created\ndata: {json.dumps(created)}\n\n".encode()])

    upstream.default = ollama
    client = proxy.client()
    asked = {"model": "m", "input": "Hello!", "tool_choice": "required", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}
    if stream:
        with client.responses.stream(**asked) as streamed:
            response = streamed.get_final_response()
    else:
        response = client.responses.create(**asked)
    assert response.output_text == "Bonjour." and chat_sent(upstream)["tool_choice"] == "required"
    assert "Ollama" in proxy.http.get("/healthz").json()["apis"]["responses"]


def test_a_messages_image_chat_cannot_take_is_refused_by_name_and_a_search_result_goes_as_text(proxy, upstream):
    upstream.default = chat_answering("ok")
    filed = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    with pytest.raises(anthropic.BadRequestError) as raised:
        proxy.anthropic().messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": [filed, {"type": "text", "text": "What is it?"}]}])
    assert "image.source" in str(raised.value)
    found = {"type": "search_result", "title": "Tides", "source": "https://example.org/tides", "content": [{"type": "text", "text": "High at 6."}]}
    proxy.anthropic().messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": [found, {"type": "text", "text": "When?"}]}])
    assert chat_sent(upstream)["messages"][-1]["content"] == "Tides\nhttps://example.org/tides\nHigh at 6.When?"


# -- conformance: every event the SDKs read, every way an answer ends -----------------------

CALL = [{"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
ENDINGS = {
    "text": {"pieces": ["Sunny ", "all day."], "finish": "stop"},
    "tool": {"pieces": [], "tool_calls": CALL},
    "limit": {"pieces": ["It is sun", "ny and"], "finish": "length"},
}


def ending(kind: str):
    said = ENDINGS[kind]

    def reply(recorded: Recorded) -> Reply:
        if not recorded.path.endswith("/chat/completions"):
            return Reply(status=404, body=b'{"detail": "Not Found"}')
        usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
        if recorded.json.get("stream"):
            return stream_reply(said["pieces"], usage=usage, finish=said.get("finish"), tool_calls=said.get("tool_calls"))
        return completion("".join(said["pieces"]), tool_calls=said.get("tool_calls"), finish=said.get("finish"), prompt_tokens=9, completion_tokens=4)

    return reply


def conversation(protocol: bool) -> list[dict]:
    """The question alone, or after a history long enough for protocol mode (``start``'s threshold)."""
    return [*long_history()[1:-1], {"role": "user", "content": "Weather?"}] if protocol else [{"role": "user", "content": "Weather?"}]


def start(start_proxy, protocol: bool):
    return start_proxy(sentry_threshold=500, context_budget=BUDGET, max_rounds=1) if protocol else start_proxy()


@pytest.mark.parametrize("kind", list(ENDINGS))
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", [False, True])
def test_the_openai_sdk_reads_every_translated_responses_answer(start_proxy, upstream, kind, stream, protocol):
    upstream.default = ending(kind)
    proxy = start(start_proxy, protocol)
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    asked = {"model": "m", "input": conversation(protocol), "tools": tools, "max_output_tokens": 4}
    if stream:
        events = list(proxy.client().responses.create(**asked, stream=True))  # each one parsed into its typed model
        assert [e.sequence_number for e in events] == list(range(len(events)))
        response = events[-1].response
        assert events[-1].type == ("response.incomplete" if kind == "limit" else "response.completed")
    else:
        response = proxy.client().responses.create(**asked)
    assert response.status == ("incomplete" if kind == "limit" else "completed")
    if kind == "tool":
        assert (response.output[0].type, response.output[0].call_id, json.loads(response.output[0].arguments)) == ("function_call", "call_9", {"city": "Oslo"})
    else:
        assert response.output_text == "".join(ENDINGS[kind]["pieces"])
    assert (response.usage.input_tokens, response.usage.output_tokens) == (9, 4)
    assert proxy.http.get("/healthz").status_code == 200 and (not protocol or len(upstream.chat_requests("worker")) == 1)


@pytest.mark.parametrize("kind", list(ENDINGS))
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("protocol", [False, True])
def test_the_anthropic_sdk_reads_every_translated_message(start_proxy, upstream, kind, stream, protocol):
    upstream.default = ending(kind)
    proxy = start(start_proxy, protocol)
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    asked = {"model": "m", "max_tokens": 4, "tools": tools, "messages": conversation(protocol)}
    client = proxy.anthropic()
    if stream:
        with client.messages.stream(**asked) as streamed:
            events = list(streamed)  # each one parsed into its typed model
            message = streamed.get_final_message()
        assert events[0].type == "message_start" and events[-1].type == "message_stop"
    else:
        message = client.messages.create(**asked)
    assert message.stop_reason == {"text": "end_turn", "tool": "tool_use", "limit": "max_tokens"}[kind]
    if kind == "tool":
        assert (message.content[-1].type, message.content[-1].id, message.content[-1].input) == ("tool_use", "call_9", {"city": "Oslo"})
    else:
        assert message.content[0].text == "".join(ENDINGS[kind]["pieces"])
    assert message.usage.output_tokens == 4
    assert not protocol or len(upstream.chat_requests("worker")) == 1


def test_allowed_tools_leave_the_others_out_and_a_custom_tools_grammar_is_told(proxy, upstream):
    upstream.default = chat_answering("ok")
    tools = [
        {"type": "function", "name": "read", "parameters": {"type": "object"}},
        {"type": "function", "name": "write", "parameters": {"type": "object"}},
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Patch files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'},
        },
    ]
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "read"}, {"type": "custom", "name": "apply_patch"}]}
    proxy.client().responses.create(model="m", input="Fix it.", tools=tools, tool_choice=choice)
    sent = chat_sent(upstream)
    assert [t["function"]["name"] for t in sent["tools"]] == ["read", "apply_patch"] and sent["tool_choice"] == "required"
    assert sent["tools"][1]["function"]["description"] == 'Patch files.\n\nThe input follows this lark grammar:\nstart: "*** Begin Patch"'
