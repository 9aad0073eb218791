"""Requests no client should send: each is a 400 in the envelope that says what is wrong, in both modes, never the proxy's 500."""

from __future__ import annotations

import json

import pytest

from proxy.testing.upstream import completion

HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} about gardens and the river trip {i}"} for i in range(60)]
MODES = {"passthrough": 1_000_000, "protocol": 200}


@pytest.fixture(params=list(MODES))
def mode_proxy(request, start_proxy):
    return start_proxy(sentry_threshold=MODES[request.param], context_budget=700)


def body_with(message_extra: bytes = b"", top_extra: bytes = b"") -> bytes:
    """A long enough request with raw bytes spliced into its last message and at its top level."""
    history = json.dumps(HISTORY)[1:-1].encode()
    last = b'{"role":"user","content":"what about the river?"' + message_extra + b"}"
    return b'{"model":"m"' + top_extra + b',"messages":[' + history + b"," + last + b"]}"


def post(proxy, body: bytes, **headers):
    return proxy.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json", "authorization": "Bearer k", **headers})


def assert_400(response, code: str | None = None) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code
    return error


def test_invalid_utf8_in_what_the_proxy_reads_is_a_400(mode_proxy):
    error = assert_400(post(mode_proxy, body_with(b',"name":"\xff\xfe"').replace(b"what about", b"what \xc3\x28bout")), "invalid_encoding")
    assert "UTF-8" in error["message"] and "0xc3" in error["message"]


def test_invalid_utf8_in_a_field_the_proxy_does_not_read_goes_upstream_as_sent(mode_proxy, upstream):
    upstream.default = lambda _: completion("fine")
    response = post(mode_proxy, body_with(top_extra=b',"vendor":"\xc3\x28"'))
    assert response.status_code == 200
    assert b'"vendor":"\xc3\x28"' in upstream.chat_requests()[-1].body


@pytest.mark.parametrize("where", ["message", "top"])
def test_json_nested_a_thousand_levels_deep_is_a_400(mode_proxy, where):
    deep = b',"x":' + b"[" * 1000 + b"]" * 1000
    body = body_with(message_extra=deep) if where == "message" else body_with(top_extra=deep)
    assert "nested too deeply" in assert_400(post(mode_proxy, body), "too_deep")["message"]


def test_nesting_just_within_reach_is_served(mode_proxy, upstream):
    upstream.default = lambda _: completion("fine")
    response = post(mode_proxy, body_with(top_extra=b',"x":' + b"[" * 200 + b"]" * 200))
    assert response.status_code == 200


@pytest.mark.parametrize("number", [b"1e999", b"-1e999", b"9" * 5000])
def test_a_number_out_of_range_in_an_unread_field_is_a_400_that_names_it(mode_proxy, upstream, number):
    error = assert_400(post(mode_proxy, body_with(top_extra=b',"vendor_seed":' + number)), "number_out_of_range")
    assert error["param"] == "vendor_seed" and "out of range" in error["message"]
    assert upstream.requests == []  # what no decoder reads as a number never goes upstream


@pytest.mark.parametrize("number", [b"1e-999", b"9" * 400])
def test_a_number_within_range_in_an_unread_field_goes_upstream_as_sent(mode_proxy, upstream, number):
    upstream.default = lambda _: completion("fine")
    response = post(mode_proxy, body_with(top_extra=b',"vendor_seed":' + number))
    assert response.status_code == 200, response.text
    assert b'"vendor_seed":' + number in upstream.chat_requests()[-1].body


@pytest.mark.parametrize("number", [b"1e999", b"9" * 5000])
def test_a_number_out_of_range_in_a_message_is_a_400_that_names_it(mode_proxy, number):
    error = assert_400(post(mode_proxy, body_with(message_extra=b',"weight":' + number)), "number_out_of_range")
    assert error["param"] == "messages.[60].weight"
    assert "out of range" in error["message"]


def test_a_header_that_is_not_ascii_is_a_400_naming_it(mode_proxy, upstream):
    before = len(upstream.requests)
    error = assert_400(post(mode_proxy, body_with(), **{"x-title": "Caf\xe9 \u2603".encode()}), "invalid_header")
    assert error["param"] == "x-title"
    assert len(upstream.requests) == before  # nothing went upstream


def test_a_number_out_of_range_in_an_upstream_answer_is_a_502_not_invalid_json(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=200, context_budget=700)
    upstream.default = lambda _: completion("fine")
    answer = json.loads(completion("fine").body)
    upstream.enqueue(lambda _: completion("x").__class__(body=json.dumps(answer).replace('"fine"', '"fine", "score": 1e999').encode()))
    response = post(proxy, body_with())
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_bad_response"
