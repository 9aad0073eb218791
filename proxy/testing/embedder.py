"""A deterministic embedder for tests (``StandInEmbedder``), in place of the bundled encoder."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..recall.upstream_embeddings import done

__all__ = ["StandInEmbedder"]


class StandInEmbedder:
    """A deterministic embedder for tests, in place of MiniLM: what the rounds ask of one, and nothing to load.

    A text's vector is the sum of its words' vectors, each word's a hash of it,
    except that the words of one ``alike`` group share one: a test names the
    paraphrases dense recall should find (("dog", "greyhound")).
    """

    def __init__(self, alike: Iterable[Iterable[str]] = (), dimensions: int = 256):
        self.dimensions = dimensions
        self.group = {word: min(words) for words in map(list, alike) for word in words}
        self.prefetched: list[str] = []
        self.asked: list[tuple[str, int]] = []  # (query, how many texts)
        self.requests_served = 0

    def vector(self, text: str) -> Any:
        """A stand-in embedding of ``text``: its words hashed into the dimensions, normalized."""
        import numpy as np

        total = np.zeros(self.dimensions)
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            seed = int.from_bytes(hashlib.blake2b(self.group.get(word, word).encode(), digest_size=8).digest(), "big")
            total += np.random.default_rng(seed).standard_normal(self.dimensions)
        norm = np.linalg.norm(total)
        return total / norm if norm else total

    def prefetch(self, text: str, headers: Any = None) -> Any:
        """Note ``text`` as asked for ahead; done at once."""
        self.prefetched.append(text)
        return done()

    ready = True

    def embed_sync(self, texts: Sequence[str]) -> Any:
        """The stand-in embeddings of ``texts``."""
        import numpy as np

        return np.array([self.vector(text) for text in texts], dtype=np.float32).reshape(len(texts), self.dimensions)

    def vectors(self, texts: Sequence[str]) -> Any:
        """As the real embedder's: what a store that indexes pages (memory) asks for."""
        return self.embed_sync(texts)

    async def similarities_when_ready(self, query: str, texts: Sequence[str], headers: Any = None) -> Any:
        """The cosine similarities of ``query`` to each of ``texts``."""
        import numpy as np

        self.asked.append((query, len(texts)))
        vector = self.vector(query)
        return np.array([float(self.vector(text) @ vector) for text in texts])

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Count a request served while the block runs."""
        self.requests_served += 1
        try:
            yield
        finally:
            self.requests_served -= 1

    def close(self) -> None:
        """Nothing to close."""
        pass
