"""What the proxy keeps in memory for its conversations, bounded by ``cache_mb``: the shares, and what a session holds.

The store is the truth; memory is a cache of it. Each cache takes its share
of ``cache_mb`` and, past it, drops what was used least recently (a whole
session, the older vectors, the texts queued first for the encoder, the
oldest BM25 index, a memory scope's index), which the next request that
needs it reads again from the store (or, for a text shed before it was
encoded, queues again); what is kept by text (counts, pages' texts and
terms) is forgotten as sessions leave past its share. What is
left out: the model and libraries of dense recall, the interpreter, and
what the allocator keeps of what requests freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable
from itertools import chain
from operator import attrgetter
from typing import Any

from pcp_core import Session
from pcp_core.ranking.router import text_memos

__all__ = ["SHARES", "TextMemos", "close_least_used", "give_back", "indexes_bytes", "scope_index_bytes", "session_bytes", "share", "used_last"]

# Of ``cache_mb``: decoded sessions, what is kept by their texts (``TextMemos``), the chat bodies read last (``apis.known_bodies``), their texts' vectors and
# those waiting for the encoder (``recall.embeddings``), their BM25 indexes and texts' terms, memory scopes' indexes.
SHARES = {"sessions": 0.25, "texts": 0.0625, "bodies": 0.125, "vectors": 0.25, "queue": 0.0625, "bm25": 0.125, "memory": 0.125}

# What a Python object of each kind costs beyond its text (CPython 3.11, 64 bits): a page's struct,
# its id, timestamp and keyword tuple; a link (a list slot and a 32-character string); a message's time.
PAGE = 420
KEYWORD = 60
LINK = 90
SEEN = 16  # a list slot: the timestamps themselves are shared by the messages paged together
TERM = 110  # a document-frequency entry: its key and count
_CONTENT, _SUMMARY, _KEYWORDS = attrgetter("content"), attrgetter("summary"), attrgetter("keywords")


def share(cache_mb: int, part: str) -> int:
    """The bytes ``part`` (one of ``SHARES``) may hold."""
    return int(cache_mb * 2**20 * SHARES[part])


def session_bytes(session: Session) -> int:
    """About what ``session`` holds in memory, decoded (within a third: tests/proxy/test_resident.py).

    One pass in C over its pages' texts: cheap beside the request even at a million tokens.
    """
    pages = session.pages
    every = list(chain(pages.leaves, pages.containers, pages.storage, *(block.drafts for block in pages.blocks)))
    text = sum(map(len, map(_CONTENT, every))) + sum(map(len, map(_SUMMARY, every)))
    keywords = sum(map(len, map(_KEYWORDS, every)))
    frame = len(session.frame.text) + 200 * len(session.frame.shown) if session.frame is not None else 0
    return text + PAGE * len(every) + KEYWORD * keywords + LINK * len(session.chain) + SEEN * len(session.seen_at) + TERM * len(pages.df) + frame


# -- what is kept by text, whatever its session -------------------------------------------------
# About what an entry of each memo holds once its session has left memory, the text it is kept by included: a
# message's count, a prompt's line's, a page's text without its turn markers, a page read with the one before, a
# page's terms (tracemalloc, 80 LoCoMo conversations of 25k tokens).
MEMO_ENTRY = {"counts": 300, "lines": 340, "units": 900, "readings": 900, "terms": 750}


class TextMemos:
    """What the tokenizer and the protocol keep by text, whatever session it came from: each message's count and
    the memos of pages' texts (``pcp_core.ranking.router.text_memos``), each bounded by count alone (65,536 to 200,000
    texts: a large share of resident memory with many conversations live, ``bench/resident.py``).

    Past ``max_bytes`` (estimated), they are all forgotten when a session leaves memory: a conversation that
    stays (one of a million tokens and its follow-ups) keeps its own, and one beside many that come and go
    counts and reads its texts again once after each forgetting.
    """

    def __init__(self, tokenizer: Any, max_bytes: int):
        self.memos: dict[str, Any] = {"counts": tokenizer.count, "lines": tokenizer.lines, **text_memos()}
        self.max_bytes = max_bytes
        self.forgotten = 0

    @property
    def resident_bytes(self) -> int:
        """What the memos hold, estimated from their entries."""
        return sum(memo.cache_info().currsize * MEMO_ENTRY[name] for name, memo in self.memos.items())

    def session_left(self) -> None:
        """A session left memory: past ``max_bytes``, forget what is kept by text (the next request that wants it computes it again)."""
        if self.max_bytes and self.resident_bytes > self.max_bytes:
            for memo in self.memos.values():
                memo.cache_clear()
            self.forgotten += 1


# -- memory scopes' indexes (``proxy.memory.service``) ------------------------------------------
INDEXED_PAGE = 400  # a page in the keyword index: its postings, its row, length and liveness


def scope_index_bytes(index: Any) -> int:
    """About what a scope's index (``proxy.memory.search.ScopeIndex``) holds: its vectors and a page's postings each."""
    vectors = index.vectors
    dense = int(vectors.index.ntotal) * vectors.dim * 4 if vectors is not None else 0
    return dense + INDEXED_PAGE * index.lexical.n


def indexes_bytes(indexes: dict[str, Any]) -> int:
    """What the memory scopes' search indexes hold in memory, estimated."""
    return sum(scope_index_bytes(index) for index in list(indexes.values()))


def close_least_used(indexes: dict[str, Any], max_bytes: int) -> None:
    """Close the least recently used of ``indexes`` (in use order, the last used last) while they hold more than
    ``max_bytes`` (0: never), each saved first; the last stays. Their owner's lock held."""
    while max_bytes and len(indexes) > 1 and indexes_bytes(indexes) > max_bytes:
        scope, index = next(iter(indexes.items()))
        index.save_if_due(index.row, index.seq, force=True)  # at its own position: what it applied
        del indexes[scope]


def used_last(indexes: dict[str, Any], scope: str, lock: threading.Lock) -> None:
    """Move ``scope`` to the end of ``indexes``: the last to be closed."""
    if next(reversed(indexes), None) == scope:
        return
    with lock:  # a reader that misses it meanwhile looks again under the lock (``Memory.index``)
        if scope in indexes:
            indexes[scope] = indexes.pop(scope)


# -- what the allocator keeps --------------------------------------------------------------------
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None elsewhere (musl, macOS), where there is nothing to do."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def give_back() -> None:
    """Return to the system the memory freed in the middle of the allocator's heaps, every thread's.

    glibc keeps what a large allocation freed for the next one, and past a
    few such frees serves mid-sized ones from its heaps, where one live block
    pins the pages around it: encoding a history's texts in batches left
    hundreds of MB resident that nothing used (``bench/lean.py``). A few
    milliseconds, the interpreter's lock released.
    """
    if _TRIM is not None:
        _TRIM(0)
