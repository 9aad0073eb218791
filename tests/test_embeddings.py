"""The Router's embedder: real MiniLM, vectors kept on disk by text."""

from __future__ import annotations

import pytest

from proxy.embeddings import Embedder, embeddings_available

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
    assert not second._models  # read back from disk: the model was never loaded
    np.testing.assert_allclose(again, vectors[::-1])
    second.close()
