"""Images, audio and files in protocol mode: the query's reach the worker as parts, older ones stay
one Consult away, and none of them takes a prompt over the budget."""

from __future__ import annotations

import base64

import pytest
from lxml import etree

from pcp_core.conversation import part_handle
from pcp_core.prompt.document import paged_context
from pcp_core.text.tokens import LOW_DETAIL_TOKENS, PART_TOKENS, prompt_tokens
from proxy.testing.upstream import Recorded, Reply, completion
from tests.proxy.helpers import long_history

from .test_protocol import COUNT, xml

BUDGET = 2048  # an image is counted 765 tokens: room for two beside the frame, not for six
pytestmark = pytest.mark.protocol(context_budget=BUDGET)

PIXEL = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()
IMAGE = {"type": "image_url", "image_url": {"url": PIXEL, "detail": "high"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF" + bytes(256)).decode(), "format": "wav"}}
FILE = {"type": "file", "file": {"filename": "report.pdf", "file_data": "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.7" + bytes(128)).decode()}}


def asking(*parts: dict, text: str = "What is in this picture of my gym locker?") -> list[dict]:
    return [*long_history()[:-1], {"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


def user_parts(recorded: Recorded) -> list[dict]:
    content = recorded.json["messages"][-1]["content"]
    return [part for part in content if part.get("type") != "text"] if isinstance(content, list) else []


@pytest.mark.parametrize("part", [IMAGE, AUDIO, FILE], ids=["image", "audio", "file"])
def test_the_querys_parts_reach_the_worker_as_parts(protocol_proxy, upstream, part):
    upstream.enqueue(completion("A blue locker."))

    answer = protocol_proxy.client().chat.completions.create(model="m", messages=asking(part))

    (worker,) = upstream.chat_requests("worker")
    assert user_parts(worker) == [part]
    placeholder = f"[{part['type']} {part_handle(part)}]"
    assert placeholder in xml(worker).findtext("Query")  # the Query names the part its message carries
    assert {"type": "text", "text": placeholder} in worker.json["messages"][-1]["content"]
    assert prompt_tokens(worker.json["messages"], COUNT) <= BUDGET + prompt_tokens(worker.json["messages"][:1], COUNT)  # the system prompt on top
    assert answer.choices[0].message.content == "A blue locker."


def test_a_part_of_an_older_turn_is_sent_again_when_its_page_is_consulted(protocol_proxy, upstream):
    messages = long_history()
    messages[41] = {"role": "user", "content": [{"type": "text", "text": "Turn 40: here is a photo of my gym locker, code 5521."}, IMAGE]}
    placeholder = f"[image_url {part_handle(IMAGE)}]"

    def consult_the_photo(recorded: Recorded) -> Reply:
        page = next(n for n in xml(recorded).iter("Node") if placeholder in (n.findtext("Content") or "") + (n.findtext("Summary") or ""))
        return completion(f'Consult("see the photo", "{page.get("id")}")')

    upstream.enqueue(consult_the_photo, completion("The locker in the photo is blue."))
    messages[-1] = {"role": "user", "content": "What colour is my gym locker in the photo?"}

    answer = protocol_proxy.client().chat.completions.create(model="m", messages=messages)

    first, second = upstream.chat_requests("worker")
    assert user_parts(first) == []  # a placeholder until the worker asks for its page
    assert user_parts(second) == [IMAGE]
    assert "Consult the page" in xml(first).findtext("Static_Registry/System_Instructions")
    for recorded in (first, second):
        assert prompt_tokens(recorded.json["messages"], COUNT) <= BUDGET + prompt_tokens(recorded.json["messages"][:1], COUNT)  # the system prompt on top
    assert answer.choices[0].message.content == "The locker in the photo is blue."


def test_a_query_whose_parts_fill_the_budget_is_never_answered_blind(protocol_proxy, start_proxy, upstream):
    images = [{"type": "image_url", "image_url": {"url": f"{PIXEL}#{i}"}} for i in range(6)]  # 6 × 765 tokens: over the budget
    messages = asking(*images, text="Which of these is my locker?")
    upstream.enqueue(completion("Six photos."))
    response = protocol_proxy.client().chat.completions.with_raw_response.create(model="m", messages=messages)
    assert response.headers["x-pcp-mode"] == "passthrough"  # no page would fit beside them: untouched, every image with it
    (sent,) = upstream.chat_requests()
    assert user_parts(sent) == images and sent.json["messages"] == messages

    small_window = start_proxy(sentry_threshold=500, context_budget=BUDGET, context_window=4000)
    refused = small_window.http.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "context_budget_too_small"
    assert len(upstream.chat_requests()) == 1  # nothing went upstream


def test_parts_are_counted_at_a_fixed_price():
    low = {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}}
    text = {"role": "user", "content": [{"type": "text", "text": "look"}]}
    base = prompt_tokens([text], COUNT)
    for part, price in ((IMAGE, PART_TOKENS), (low, LOW_DETAIL_TOKENS), (AUDIO, PART_TOKENS), (FILE, PART_TOKENS)):
        assert prompt_tokens([{"role": "user", "content": [*text["content"], part]}], COUNT) == base + price


@pytest.mark.parametrize("parts", [[], [IMAGE]], ids=["text", "image"])
def test_the_paged_context_can_go_in_the_user_message(start_proxy, upstream, parts):
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, context_role="user")
    upstream.enqueue(completion("5521"))

    proxy.client().chat.completions.create(model="m", messages=asking(*parts, text="What is my gym locker code?"))

    (worker,) = upstream.chat_requests("worker")
    (message,) = worker.json["messages"]
    content = message["content"]
    text = content if isinstance(content, str) else content[0]["text"]
    assert message["role"] == "user" and text.startswith("You are a friendly assistant.\n\n")  # the head opens it, then the document
    assert etree.fromstring(paged_context(text)).findtext("Query").startswith("What is my gym locker code?")
    assert user_parts(worker) == parts
    assert prompt_tokens(worker.json["messages"], COUNT) <= BUDGET + prompt_tokens(worker.json["messages"][:1], COUNT)  # the system prompt on top


def test_with_the_context_in_the_user_message_no_call_of_the_proxys_has_a_system_message(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, context_role="user", router_model="router-m")
    proxy.client().chat.completions.create(model="m", messages=long_history())
    roles = {r.headers["x-pcp-role"]: [m["role"] for m in r.json["messages"]] for r in upstream.chat_requests()}
    assert roles == {"router": ["user"], "worker": ["user"]}
