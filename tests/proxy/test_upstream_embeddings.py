"""Dense recall from the upstream's own /v1/embeddings (PCP_EMBEDDINGS_UPSTREAM), against the scripted upstream."""

from __future__ import annotations

import numpy as np
import pytest
from lxml import etree

from proxy.recall.upstream_embeddings import decoded
from proxy.testing.apis import worker_document
from proxy.testing.upstream import EMBEDDING_DONE, Reply, StandInEmbedder, embeddings_reply, metric_value
from tests.proxy.helpers import BUDGET, long_history, through


def paraphrase_history() -> list[dict]:
    messages = long_history()
    messages[81]["content"] = "Turn 80: our puppy finally learned to sit, what a good boy."
    messages[-1]["content"] = "How is the dog's training going?"
    return messages


def round_zero_contents(upstream) -> str:
    prompt = worker_document(upstream.chat_requests("worker")[-1])
    return " ".join(etree.fromstring(prompt.encode()).xpath("//Content/text()"))


def embedding_calls(upstream) -> list:
    return [r for r in upstream.requests if r.path.endswith("/embeddings")]


def settled(proxy) -> str:
    return through(proxy.http, "pcp_texts_embedded_total", EMBEDDING_DONE)


def start(start_proxy, upstream, fallback: StandInEmbedder, **more):
    return start_proxy(sentry_threshold=500, context_budget=BUDGET, embeddings_upstream="embed-1", embedder=fallback, **more)


def test_page_vectors_come_from_the_upstreams_model_in_batches_once(start_proxy, upstream):
    upstream.embeddings = embeddings_reply(StandInEmbedder(alike=[("dog", "puppy"), ("training", "learned")]).vector)
    fallback = StandInEmbedder()  # knows no paraphrase: what it ranks is not what the upstream's model ranks
    proxy = start(start_proxy, upstream, fallback)
    messages = paraphrase_history()

    proxy.client().chat.completions.create(model="m", messages=messages)  # BM25 alone: the pages' vectors are on their way
    metrics = settled(proxy)
    proxy.client().chat.completions.create(model="m", messages=messages)
    assert "puppy finally learned" in round_zero_contents(upstream)

    calls = embedding_calls(upstream)
    assert {c.headers["x-pcp-role"] for c in calls} == {"embeddings"} and {c.json["model"] for c in calls} == {"embed-1"}
    assert all(c.headers["authorization"] == "Bearer sk-client" for c in calls)  # the request's own key
    pages = [text for c in calls if isinstance(c.json["input"], list) and len(c.json["input"]) > 1 for text in c.json["input"]]
    assert len(pages) == len(set(pages)) == metric_value(metrics, "pcp_texts_embedded_total", state="encoded") > 64
    assert max(len(c.json["input"]) for c in calls) <= 64  # batched
    assert not fallback.asked and metric_value(metrics, "pcp_upstream_calls_total", role="embeddings") == len(calls)


@pytest.mark.embedded_store
def test_vectors_on_disk_are_not_asked_for_again_after_a_restart(start_proxy, upstream):
    upstream.embeddings = embeddings_reply(StandInEmbedder().vector)
    first = start(start_proxy, upstream, StandInEmbedder())
    first.client().chat.completions.create(model="m", messages=paraphrase_history())
    settled(first)
    first.stop()
    before = len(embedding_calls(upstream))

    again = start(start_proxy, upstream, StandInEmbedder())
    again.client().chat.completions.create(model="m", messages=paraphrase_history())
    metrics = settled(again)
    assert metric_value(metrics, "pcp_texts_embedded_total", state="loaded") > 64
    assert [c.json["input"] for c in embedding_calls(upstream)[before:]] == [["How is the dog's training going?"]]  # the query alone


def test_the_bundled_encoder_stands_in_while_the_upstreams_model_fails(start_proxy, upstream):
    upstream.embeddings = lambda recorded: Reply(
        status=404, body=b'{"error": {"message": "no such model", "type": "invalid_request_error", "param": null, "code": null}}'
    )
    fallback = StandInEmbedder(alike=[("dog", "puppy"), ("training", "learned")])
    proxy = start(start_proxy, upstream, fallback)

    answer = proxy.client().chat.completions.create(model="m", messages=paraphrase_history())
    assert answer.choices[0].message.content == "ok"
    assert "puppy finally learned" in round_zero_contents(upstream)  # the fallback's ranking
    assert fallback.asked and len(embedding_calls(upstream)) == 1  # not asked again while it fails

    proxy.client().chat.completions.create(model="m", messages=paraphrase_history())
    assert len(embedding_calls(upstream)) == 1 and len(fallback.asked) == 2


def test_an_answer_that_is_not_embeddings_for_the_texts_is_refused():
    body = b'{"data": [{"index": 1, "embedding": [0, 2]}, {"index": 0, "embedding": [3, 4]}]}'
    np.testing.assert_allclose(decoded(body, 2), [[0.6, 0.8], [0, 1]])  # in input order, unit length
    for wrong in (b'{"data": []}', b'{"error": "x"}', b'{"data": [{"embedding": [1]}, {"index": 1, "embedding": [1, 2]}]}', b"<html>"):
        with pytest.raises(ValueError):
            decoded(wrong, 2)


def test_the_upstream_is_asked_again_once_the_fallbacks_time_is_up():
    import asyncio

    from proxy.recall.upstream_embeddings import UpstreamVectors
    from proxy.testing.upstream import FakeUpstream
    from proxy.upstream import Upstream

    fake = FakeUpstream()
    model = StandInEmbedder()
    fake.embeddings = lambda recorded: Reply(status=503, body=b'{"error": {"message": "loading"}}')
    now = [0.0]
    fallback = StandInEmbedder()
    texts = ["our puppy learned to sit", "the invoice is paid"]

    async def scenario() -> None:
        upstream = Upstream(fake.url, connect_timeout=5, read_timeout=5, transport=fake.transport())
        encoded, embedded = [], asyncio.Event()  # set once the upstream's vectors of every page are in

        def noted(state: str, n: int) -> None:
            if state == "encoded":
                encoded.append(n)
                if sum(encoded) == len(texts):
                    embedded.set()

        vectors = UpstreamVectors(upstream, "embed-1", fallback=fallback, retry_seconds=60, clock=lambda: now[0], on_encoded=noted)
        await vectors.prefetch("dog training?", {})
        assert vectors.failing and await vectors.similarities_when_ready("dog training?", texts) is not None
        assert len(fallback.asked) == 1  # the bundled encoder answered

        fake.embeddings = embeddings_reply(model.vector)
        now[0] = 30.0  # still within its time: the upstream is not asked
        await vectors.similarities_when_ready("dog training?", texts)
        assert len([r for r in fake.requests if r.path.endswith("/embeddings")]) == 1 and len(fallback.asked) == 2

        now[0] = 61.0
        assert await vectors.similarities_when_ready("dog training?", texts) is None  # asked again: the pages are on their way
        await asyncio.wait_for(embedded.wait(), timeout=10)
        cosines = await vectors.similarities_when_ready("dog training?", texts)
        np.testing.assert_allclose(cosines, [model.vector(t) @ model.vector("dog training?") for t in texts], atol=1e-3)  # held in half precision
        assert len(fallback.asked) == 2
        vectors.close()
        await upstream.aclose()

    asyncio.run(scenario())


def test_each_callers_texts_are_embedded_with_its_own_key(start_proxy, upstream):
    upstream.embeddings = embeddings_reply(StandInEmbedder().vector)
    proxy = start(start_proxy, upstream, StandInEmbedder())
    mine, theirs = paraphrase_history(), paraphrase_history()
    theirs[5]["content"] = "Turn 4: the other caller's own words about a canoe."
    proxy.client(api_key="sk-mine").chat.completions.create(model="m", messages=mine)
    proxy.client(api_key="sk-theirs").chat.completions.create(model="m", messages=theirs)
    settled(proxy)
    keys = {c.headers["authorization"] for c in embedding_calls(upstream) if any("canoe" in text for text in c.json["input"])}
    assert keys == {"Bearer sk-theirs"}
