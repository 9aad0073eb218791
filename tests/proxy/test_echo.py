"""A model that echoes its prompt: no answer, streamed or not, in any API, carries the proxy's scaffolding
(the document's tags, the registry's sentences, directives), even when the echo is cut into small pieces."""

from __future__ import annotations

import json
import re

import pytest

from pcp_core.prompt.markup import TAGS
from pcp_core.prompt.scaffolding import SENTENCES
from proxy.testing.apis import api_of, message, messages_stream, response, responses_stream
from proxy.testing.upstream import Recorded, Reply, completion, stream_reply

from .test_protocol import BUDGET, long_history

TAG_NAMES = "|".join(map(re.escape, (*TAGS, "PageContext")))
SCAFFOLDING = re.compile(rf"</?(?:{TAG_NAMES})\b|\b(?:Consult|Explore|Shelve)\s*\(")


def prompt_text(recorded: Recorded) -> str:
    """All the text of a worker call, in order, as a model that repeats its prompt would say it."""
    body = recorded.json
    said: list[str] = []
    system = body.get("instructions") or body.get("system") or ""
    said.append(system if isinstance(system, str) else "".join(block["text"] for block in system))
    for said_message in body.get("messages") or body.get("input") or []:
        content = said_message.get("content")
        said += [content] if isinstance(content, str) else [part.get("text", "") for part in content or [] if isinstance(part, dict)]
    return "\n".join(said)


def echo(recorded: Recorded) -> Reply:
    api, text, streamed = api_of(recorded), prompt_text(recorded), bool(recorded.json.get("stream"))
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]  # sentences and tags cut across events
    if api == "responses":
        return responses_stream(pieces) if streamed else response(text)
    if api == "messages":
        return messages_stream(pieces) if streamed else message(text)
    return stream_reply(pieces) if streamed else completion(text)


def answer_text(api: str, reply, stream: bool) -> str:
    if not stream:
        body = reply.json()
        if api == "chat":
            return body["choices"][0]["message"]["content"]
        if api == "responses":
            return "".join(part["text"] for item in body["output"] for part in item.get("content", []))
        return "".join(block.get("text", "") for block in body["content"])
    text = []
    for line in reply.text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        if api == "chat":
            text += [choice["delta"].get("content") or "" for choice in event.get("choices", [])]
        elif event.get("type") == "response.output_text.delta":
            text.append(event["delta"])
        elif event.get("type") == "content_block_delta" and event["delta"].get("type") == "text_delta":
            text.append(event["delta"]["text"])
    return "".join(text)


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_echoing_model_never_shows_the_client_the_proxys_scaffolding(start_proxy, upstream, api, stream):
    upstream.default = echo
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, max_rounds=2)
    history = long_history()
    body = {"model": "m", "stream": stream}
    if api == "chat":
        body["messages"] = history
    elif api == "responses":
        body.update(instructions=history[0]["content"], input=history[1:])
    else:
        body.update(system=history[0]["content"], messages=history[1:], max_tokens=64)

    reply = proxy.http.post({"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}[api], json=body)
    said = answer_text(api, reply, stream)

    assert reply.status_code == 200 and reply.headers["x-pcp-mode"] == "protocol"
    assert "<PagedContext" in prompt_text(upstream.requests[-1])  # the model did echo it all
    assert said.strip() and not SCAFFOLDING.search(said), said[:500]
    assert not [sentence for sentence in SENTENCES if sentence in said]
    assert not re.search(r"\[[0-9a-f]{8}\]", said)  # no page id: the folded pages' lines are gone too
    assert "locker code at the gym is 5521" in said  # what the conversation said stays: it is the client's own
