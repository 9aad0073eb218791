"""MiniLM on torch alone (``proxy.recall.bert``) gives the vectors sentence-transformers gives, float and int8."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.recall.embeddings import embeddings_available

pytestmark = pytest.mark.skipif(not embeddings_available(), reason="the embeddings extra is not installed")

TEXTS = [
    "",
    "x",
    "When did Melanie adopt the puppy?",
    "  Caroline went to the LGBTQ support group on 7 May 2023.  ",
    "word " * 400,  # past the model's 256 word pieces: both cut it there
    "Ünïcode — 日本語のテキスト 🎉",
    *(f"Turn {i}: the allotment, seedlings and rain, and the invoice of {i} May." * (1 + i % 3) for i in range(20)),
]


@pytest.fixture(scope="module")
def library():
    import torch
    from sentence_transformers import SentenceTransformer

    from proxy.recall.encoders import ENCODERS, model_path

    torch.set_num_threads(1)
    directory = model_path(ENCODERS["minilm"], Path("."))  # a model in a package: nothing is joined
    return directory, SentenceTransformer(str(directory), device="cpu")


def test_the_float_model_gives_the_librarys_vectors(library):
    import numpy as np

    from proxy.recall.bert import BertEncoder

    directory, model = library
    ours = BertEncoder(directory, int8=False)
    expected = model.encode(TEXTS, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(ours.batch(TEXTS), expected, atol=1e-5)
    for text, vector in zip(TEXTS, expected):
        np.testing.assert_allclose(ours.one(text), vector, atol=1e-5)


def test_the_int8_model_gives_the_librarys_int8_vectors_one_text_at_a_time(library):
    # Dynamic quantization scales each layer's input by what it holds: a text alone is compared with a text alone.
    # Attention computed in another order moves a value by 1e-7, which now and then rounds one int8 step
    # the other way: the vector is then the library's within a cosine of 0.99, as a batch's neighbours move it.
    import numpy as np
    import torch

    from proxy.recall.bert import BertEncoder

    directory, model = library
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    ours = BertEncoder(directory)
    same = 0
    for text in TEXTS:
        expected = quantized.encode([text], normalize_embeddings=True, convert_to_numpy=True)[0]
        one, batch = ours.one(text), ours.batch([text])[0]
        np.testing.assert_allclose(one, batch, atol=1e-5)
        assert float(one @ expected) > 0.99
        same += bool(np.allclose(one, expected, atol=1e-5))
    assert same >= 0.8 * len(TEXTS)


def test_a_batch_is_cut_by_word_pieces_and_keeps_the_order_of_its_texts(library, monkeypatch):
    import numpy as np

    from proxy.recall import bert

    directory, _ = library
    ours = bert.BertEncoder(directory, int8=False)
    whole = ours.batch(TEXTS)
    monkeypatch.setattr(bert, "BATCH_TOKENS", 300)  # the 256-piece text alone, the others a few at a time
    np.testing.assert_allclose(ours.batch(TEXTS), whole, atol=1e-5)
    assert ours.batch([]).shape == (0, 384)
