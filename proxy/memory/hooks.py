"""Where memory meets a chat request: its scope, whether it faults memory in, what a forwarded request leaves."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pcp_core import Conversation

from .scopes import HEADER as MEMORY_HEADER
from .scopes import Scope, request_scope

if TYPE_CHECKING:
    from ..app import Services

__all__ = ["MEMORY_HEADER", "faults", "memory_scope", "remember_forwarded"]


def memory_scope(services: Services, headers: Mapping[str, str], body: bytes, namespace: Callable[[], str]) -> Scope | None:
    """The request's memory scope (a 400 for a malformed header), or None: then nothing is read or written."""
    if services.memory is None:
        return None
    return request_scope(headers, body, namespace, services.settings.memory_scope_from_user)


def faults(services: Services, scope: Scope | None) -> bool:
    """Whether the request's scope holds pages: they are brought in, so the request goes out in protocol mode."""
    return scope is not None and services.memory is not None and services.memory.has_pages(scope.key)


def remember_forwarded(services: Services, scope: Scope | None, namespace: str, messages: list[dict[str, Any]], status: int, pinned: str | None) -> None:
    """A forwarded request's messages, written back in the background (an upstream that refused it: not)."""
    if scope is None or services.memory is None or status >= 400 or not messages:
        return
    conversation = Conversation.of(messages, services.policy.paging.blocks, services.tokenizer.count)
    services.memory.ingest(scope.key, namespace, conversation, time.time_ns(), pinned)
