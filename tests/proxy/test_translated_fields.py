"""Every field of the Responses and Messages APIs on an upstream that speaks only chat completions: carried as chat
carries it, or refused with a 400 that names it. Driven by the official openai and anthropic SDKs."""

from __future__ import annotations

import json

import pydantic
import pytest

from proxy.testing.upstream import Recorded, Reply, completion, stream_reply


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
