"""The extensions a protocol-mode request carries, as hooks: PACT components, Hybrid mode, memory.

Each is built once per request (``extensions``), and only where it applies:
the driver then calls every hook at the same points of the request, and none
of it asks which extension is on. A hook does nothing at a point it does not
care about.

* ``pages`` — before paging: the pages it brings beside the history's (memory's recall);
* ``prepared`` — once paged, in a thread: the request's rounds as it changes them;
* ``answered`` / ``streamed`` — a worker call's answer, whole or as its events;
* ``load`` — a page fault: the pages of a container the worker opens;
* ``settled`` — the request ends: what it keeps of the session it leaves;
* ``headers`` — what the response tells the client of it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from pcp_core import Conversation, Outcome, Page, Prepared, Resolution
from pcp_core.memory import memory_use

from .. import headers as pcp

if TYPE_CHECKING:
    from pcp_core.session import Session

    from ..apis.codec import Codec
    from ..hybrid.turn import ContextTurn
    from ..memory.scopes import Scope
    from ..memory.service import Memory
    from ..pact import Components

__all__ = ["AskRouter", "Hook", "HybridHook", "MemoryHook", "PactHook"]

# The router model asked with these messages under this role (``calls.UpstreamCalls.router``): its reply, if it gave one.
AskRouter = Callable[[list[dict[str, Any]], str], Awaitable[str | None]]


class Hook:
    """One extension's part in a request; every method does nothing unless the extension overrides it."""

    async def pages(self, conversation: Conversation, ask_router: AskRouter) -> list[Page]:
        """The pages it brings to the request, beside its history's (``ask_router``: the router model, under a role of the extension's)."""
        return []

    def prepared(self, conversation: Conversation, resolution: Resolution, prepared: Prepared) -> Prepared:
        """The request's rounds as the extension changes them (blocking: called in a thread)."""
        return prepared

    def answered(self, data: dict[str, Any]) -> None:
        """A worker call's whole answer, read (it may take its part out of it)."""

    def streamed(self, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """A worker call's answer as its events, read as they come."""
        return events

    async def load(self, ids: Sequence[str]) -> list[Page]:
        """The pages ``ids`` of a container the worker opens that the extension holds."""
        return []

    def settled(self, session: Session, conversation: Conversation, outcome: Outcome) -> None:
        """The request has ended, leaving ``session``: what the extension keeps of it."""

    def headers(self) -> dict[str, str]:
        """What the response tells the client of the extension."""
        return {}


class PactHook(Hook):
    """PACT components: the session's, placed in its pages, and how many rendered."""

    def __init__(self, components: Components, namespace: str, codec: Codec):
        self.components, self.namespace, self.codec = components, namespace, codec
        self.rendered: int | None = None  # live components rendered; None: the session has none

    def prepared(self, conversation: Conversation, resolution: Resolution, prepared: Prepared) -> Prepared:
        """``prepared`` with the session's live components where they render."""
        prepared = self.components.attach(self.namespace, conversation, resolution, prepared, self.codec.components)
        self.rendered = prepared.components
        return prepared

    def headers(self) -> dict[str, str]:
        """``x-pcp-components``, where the session has components."""
        return {pcp.COMPONENTS: str(self.rendered)} if self.rendered is not None else {}


class HybridHook(Hook):
    """Hybrid mode: its rules and the session's snapshot after the PagedContext, the context section read out of every answer."""

    def __init__(self, turn: ContextTurn):
        self.turn = turn

    def prepared(self, conversation: Conversation, resolution: Resolution, prepared: Prepared) -> Prepared:
        """``prepared`` with the rules and the snapshot within the budget."""
        return self.turn.protocol(conversation, resolution, prepared)

    def answered(self, data: dict[str, Any]) -> None:
        """The context section out of every choice."""
        self.turn.sections().completion(data)

    def streamed(self, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """The context section out of the events, as they come."""
        return self.turn.sections().events(events)

    def settled(self, session: Session, conversation: Conversation, outcome: Outcome) -> None:
        """The answer's snapshot, read and kept."""
        self.turn.finish()

    def headers(self) -> dict[str, str]:
        """``x-pcp-context-round``."""
        return self.turn.response_headers()


class MemoryHook(Hook):
    """Memory across conversations: the pages its Router recalls, the containers the worker opens, what the request writes back."""

    def __init__(self, memory: Memory, scope: Scope, router: bool):
        self.memory, self.scope, self.router = memory, scope, router
        self.recalled: list[Page] = []

    async def pages(self, conversation: Conversation, ask_router: AskRouter) -> list[Page]:
        """The pages the Memory Router picks from the scope (none when it holds none)."""
        if not self.memory.has_pages(self.scope.key):
            return []
        ask = (lambda messages: ask_router(messages, "memory-router")) if self.router else None
        self.recalled = await self.memory.recall(self.scope.key, conversation, time.time_ns(), ask)
        return self.recalled

    async def load(self, ids: Sequence[str]) -> list[Page]:
        """A page fault: the memory container the worker opens."""
        return await self.memory.load(self.scope.key, ids)

    def settled(self, session: Session, conversation: Conversation, outcome: Outcome) -> None:
        """The session, written back in the background."""
        self.memory.write_back(self.scope.key, session, conversation, time.time_ns(), memory_use(self.recalled, outcome))
