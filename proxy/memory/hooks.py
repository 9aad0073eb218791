"""Where memory meets a request of a paged API: its scope, whether it faults memory in, what a forwarded request leaves."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from pcp_core import Conversation

from .scopes import Scope, request_scope
from .service import Memory

__all__ = ["memory_scope", "remember_forwarded", "scope_has_pages"]


def memory_scope(memory: Memory | None, headers: Mapping[str, str], body: bytes, namespace: Callable[[], str], from_user: bool) -> Scope | None:
    """The request's memory scope (a 400 for a malformed header), or None: then nothing is read or written.
    ``from_user``: a body's ``user`` names the scope when no header does (``memory_scope_from_user``)."""
    if memory is None:
        return None
    return request_scope(headers, body, namespace, from_user)


def scope_has_pages(memory: Memory | None, scope: Scope | None) -> bool:
    """Whether the request's scope holds pages: they are brought in, so the request goes out in protocol mode."""
    return scope is not None and memory is not None and memory.has_pages(scope.key)


def remember_forwarded(memory: Memory | None, scope: Scope | None, namespace: str, messages: list[dict[str, Any]], status: int, pinned: str | None) -> None:
    """A forwarded request's messages, written back in the background (an upstream that refused it: not)."""
    if scope is None or memory is None or status >= 400 or not messages:
        return
    conversation = Conversation.of(messages, memory.policy.paging.blocks, memory.count)
    memory.ingest(scope.key, namespace, conversation, time.time_ns(), pinned)
