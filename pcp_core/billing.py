"""What a prompt costs, as providers bill input with a prefix cache.

OpenAI caches a prompt's prefix it has seen before from 1,024 tokens, in steps
of 128, and Anthropic's cache reads are priced alike: such tokens cost a
fraction (``price``, 0.1 for both) of an uncached one. A request's bill is
what the proxy weighs paging against (``request.paging_pays``) and what its
``x-pcp-tokens-saved`` reports: in uncached-token units, against the same
request sent untouched.
"""

from __future__ import annotations

__all__ = ["CACHE_LEAST", "CACHE_STEP", "billed", "cached", "cached_at_most"]

CACHE_LEAST = 1024  # the shortest prefix a provider caches
CACHE_STEP = 128  # a cached prefix counts in steps of this many tokens


def cached(shared: int) -> int:
    """Of a prefix of ``shared`` tokens seen before, what a provider bills as cached."""
    return 0 if shared < CACHE_LEAST else shared // CACHE_STEP * CACHE_STEP


def cached_at_most(shared: int) -> int:
    """Of a prefix of ``shared`` tokens seen before, the most a provider could bill as cached: all of it, from
    1,024 tokens. What a request sent untouched is priced at, so that a saving claimed against it (where the
    tokens are the proxy's count, not the provider's, and its steps may fall elsewhere) is never one that was not."""
    return shared if shared >= CACHE_LEAST else 0


def billed(tokens: int, read: int, price: float) -> float:
    """The input a call of ``tokens`` tokens is billed, ``read`` of them from the cache at ``price`` each."""
    read = min(read, tokens)
    return tokens - read + price * read
