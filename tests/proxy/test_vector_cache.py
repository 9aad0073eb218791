"""The embedder's memory: vectors by text in one matrix, compared with a query a block at a time.

Rows are held in half precision: a cosine agrees with float32's to ~1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest

from proxy.recall.vectors import VectorCache, torch_widened


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def test_cosines_are_nan_for_texts_not_held():
    cache = VectorCache(capacity=10)
    cache.add({"dog": unit(1, 0), "cat": unit(0.6, 0.8)})
    cosines = cache.cosines(["cat", "bird", "dog"], unit(1, 0))
    np.testing.assert_allclose(cosines[[0, 2]], [0.6, 1.0], atol=1e-3)
    assert np.isnan(cosines[1])


def test_a_full_cache_drops_its_older_half_and_keeps_the_rest_right():
    rng = np.random.default_rng(3)
    vectors = {f"t{i}": unit(*rng.normal(size=8)) for i in range(14)}
    cache = VectorCache(capacity=8, gather_block=2)  # several blocks even for a few rows
    for start in range(0, 14, 3):  # requests add a few texts at a time; the matrix grows and compacts
        cache.add({t: vectors[t] for t in list(vectors)[start : start + 3]})
    assert len(cache) <= 8 and len(cache._matrix) <= 8  # memory stays within the capacity
    held = [t for t in vectors if not np.isnan(cache.cosines([t], vectors[t])[0])]
    assert held[-1] == "t13" and "t0" not in held
    query = unit(*rng.normal(size=8))
    np.testing.assert_allclose(cache.cosines(held, query), [float(vectors[t] @ query) for t in held], atol=1e-3)


def test_cosines_widened_by_torch_are_numpys_to_the_bit():
    """The bundled encoder's process widens rows by torch (``torch_widened``): the ranking must not move by a bit."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    vectors = {f"t{i}": unit(*rng.normal(size=384)) for i in range(700)}
    by_numpy, by_torch = VectorCache(capacity=1000, gather_block=256), VectorCache(capacity=1000, gather_block=256)
    by_torch.widen = torch_widened
    for cache in (by_numpy, by_torch):
        cache.add(vectors)
    texts = [f"t{i}" for i in rng.permutation(700)[:500]] + ["not held"]  # out of order, over several blocks, one missing
    query = unit(*rng.normal(size=384))
    numpy_cosines, torch_cosines = by_numpy.cosines(texts, query), by_torch.cosines(texts, query)
    assert np.isnan(torch_cosines[-1]) and np.isnan(numpy_cosines[-1])
    assert np.array_equal(numpy_cosines[:-1], torch_cosines[:-1])
    np.testing.assert_allclose(torch_cosines[:-1], [float(vectors[t] @ query) for t in texts[:-1]], atol=2e-3)
