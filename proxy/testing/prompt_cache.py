"""Anthropic's prompt cache as its documentation states it, for a fake upstream (``proxy.testing.upstream.FakeUpstream``).

A Messages request is read as blocks in the order Anthropic caches them:
its tools, its ``system`` blocks, then each message's content blocks. A
``cache_control`` mark writes an entry for the prefix that ends with its
block, when that prefix holds at least ``min_tokens``; a later request reads
the longest entry whose prefix it repeats exactly, looking for one at each
of its marks and at the ends of up to ``lookback`` blocks before each. No
entry is ever found inside a block. Tokens are counted with the proxy's
tokenizer, so the figures are Anthropic's in kind, not to the token::

    cache = PromptCache(count)
    with FakeUpstream(default=cache.replying(simulated_worker)) as fake:
        ...
    cache.calls  # the usage of each worker call, in order
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from ..headers import ROLE
from .replies import Recorded, Reply

__all__ = ["PromptCache"]

MARK = "cache_control"


class PromptCache:
    def __init__(self, count: Callable[[str], int], min_tokens: int = 1024, lookback: int = 20):
        self.count, self.min_tokens, self.lookback = count, min_tokens, lookback
        self.entries: set[str] = set()
        self.calls: list[dict[str, int]] = []  # the usage of each call seen, in order

    def usage(self, body: dict[str, Any]) -> dict[str, int]:
        """The ``usage`` Anthropic would report for ``body``'s input, with the entries it reads and writes."""
        keys, tokens, marked = _prefixes(_blocks(body), self.count)
        read = max((self._found(keys, tokens, at) for at in marked), default=0)
        written = [at for at in marked if tokens[at] >= self.min_tokens]
        self.entries.update(keys[at] for at in written)
        created = max((tokens[at] for at in written), default=0)
        total = tokens[-1] if tokens else 0
        creation = max(created - read, 0)
        self.calls.append({"input_tokens": total - read - creation, "cache_read_input_tokens": read, "cache_creation_input_tokens": creation})
        return self.calls[-1]

    def _found(self, keys: Sequence[str], tokens: Sequence[int], mark: int) -> int:
        """The tokens of the longest cached prefix that ends at most ``lookback`` blocks before ``mark``."""
        for at in range(mark, max(mark - self.lookback, -1), -1):
            if keys[at] in self.entries:
                return tokens[at]
        return 0

    def replying(self, worker: Callable[[Recorded], Reply]) -> Callable[[Recorded], Reply]:
        """``worker``'s replies, a Messages reply of a proxy's worker call with this cache's ``usage``."""

        def reply(recorded: Recorded) -> Reply:
            """The worker's answer, its usage telling what the cache read and wrote."""
            answer = worker(recorded)
            if recorded.headers.get(ROLE) != "worker" or not recorded.path.endswith("/messages") or answer.chunks is not None:
                return answer
            message = json.loads(answer.body)
            message["usage"] = {**message.get("usage", {}), **self.usage(recorded.json)}
            return Reply(status=answer.status, body=json.dumps(message).encode(), headers=answer.headers)

        return reply


def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Messages request's blocks in the order Anthropic caches them: tools, system, messages."""
    system = body.get("system") or []
    messages = [block for message in body.get("messages", []) for block in _content(message)]
    return [*body.get("tools", []), *([{"type": "text", "text": system}] if isinstance(system, str) else system), *messages]


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's content as blocks."""
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])


def _prefixes(blocks: Sequence[dict[str, Any]], count: Callable[[str], int]) -> tuple[list[str], list[int], list[int]]:
    """For each block, a key of the prefix that ends with it and the prefix's tokens; and the marked blocks."""
    keys, tokens, marked = [], [], []
    digest, total = hashlib.sha256(), 0
    for at, block in enumerate(blocks):
        plain = {k: v for k, v in block.items() if k != MARK}
        encoded = json.dumps(plain, sort_keys=True)
        text = plain["text"] if plain.get("type") == "text" and isinstance(plain.get("text"), str) else encoded
        digest.update(encoded.encode() + b"\x00")
        total += count(text)
        keys.append(digest.copy().hexdigest())
        tokens.append(total)
        if MARK in block:
            marked.append(at)
    return keys, tokens, marked
