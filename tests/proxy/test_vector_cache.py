"""The embedder's memory: vectors by text in one matrix, compared with a query a block at a time."""

from __future__ import annotations

import numpy as np

from proxy.recall import vectors as vector_module
from proxy.recall.vectors import VectorCache

HALF = 1e-3  # rows are held in half precision: a cosine of unit vectors moves by less than this


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


def test_cosines_are_nan_for_texts_not_held():
    cache = VectorCache(capacity=10)
    cache.add({"dog": unit(1, 0), "cat": unit(0.6, 0.8)})
    cosines = cache.cosines(["cat", "bird", "dog"], unit(1, 0))
    np.testing.assert_allclose(cosines[[0, 2]], [0.6, 1.0], atol=HALF)
    assert np.isnan(cosines[1])


def test_a_full_cache_drops_its_older_half_and_keeps_the_rest_right(monkeypatch):
    monkeypatch.setattr(vector_module, "GATHER_BLOCK", 2)  # several blocks even for a few rows
    rng = np.random.default_rng(3)
    vectors = {f"t{i}": unit(*rng.normal(size=8)) for i in range(14)}
    cache = VectorCache(capacity=8)
    for start in range(0, 14, 3):  # requests add a few texts at a time; the matrix grows and compacts
        cache.add({t: vectors[t] for t in list(vectors)[start : start + 3]})
    assert len(cache) <= 8 and len(cache._matrix) <= 8  # memory stays within the capacity
    held = [t for t in vectors if not np.isnan(cache.cosines([t], vectors[t])[0])]
    assert held[-1] == "t13" and "t0" not in held
    query = unit(*rng.normal(size=8))
    np.testing.assert_allclose(cache.cosines(held, query), [float(vectors[t] @ query) for t in held], atol=HALF)
