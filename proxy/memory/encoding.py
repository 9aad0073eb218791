"""Memory's vectors from the bundled encoder (or the upstream's): its pages', a query's, and a stored one's cosine.

Vectors are worth having, never worth a lost write or a failed request: an
encoder that fails leaves pages without vectors and the Memory Router with
its keywords alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from pcp_core import Page
from pcp_core.memory import vector_text

__all__ = ["cosine", "encode_pages", "encode_query", "vector_bytes", "vector_of"]

log = logging.getLogger("pcp.memory")


def encode_pages(embedder: Any, pages: Sequence[Page]) -> dict[str, bytes]:
    """Each page's vector as the store keeps it, by page id; none where there is no encoder or it fails."""
    encode = getattr(embedder, "vectors", None)
    if encode is None or not pages:
        return {}
    try:
        matrix = encode([vector_text(page) for page in pages])
    except Exception:
        log.exception("memory pages are kept without vectors")
        return {}
    return {page.id: vector_bytes(row) for page, row in zip(pages, matrix)}


def encode_query(embedder: Any, text: str) -> Any:
    """The query's vector, or None: no encoder, not ready yet, or it failed."""
    embed = getattr(embedder, "embed_sync", None)
    if embed is None or not text or not getattr(embedder, "ready", True):
        return None
    try:
        return np.asarray(embed([text])[0], dtype=np.float32)
    except Exception:
        log.exception("the memory Router goes on without the query's vector")
        return None


def cosine(vector: Any, raw: bytes | None) -> float:
    """The cosine of a query's vector with a stored one (both unit); NaN where either is missing or they differ in size."""
    stored = vector_of(raw)
    if vector is None or stored is None or len(stored) != len(vector):
        return float("nan")
    return float(stored @ vector)


def vector_bytes(vector: np.ndarray) -> bytes:
    """A vector as the store keeps it: float16, half the bytes of float32 for a ranking that does not change."""
    return np.asarray(vector, dtype=np.float16).tobytes()


@overload
def vector_of(raw: bytes) -> np.ndarray:
    """A stored vector (float16 bytes) as float32."""


@overload
def vector_of(raw: bytes | None) -> np.ndarray | None:
    """A stored vector as float32, or None for none."""


def vector_of(raw: bytes | None) -> np.ndarray | None:
    """A stored vector (float16 bytes) as float32, or None for none."""
    return None if raw is None else np.frombuffer(raw, dtype=np.float16).astype(np.float32)
