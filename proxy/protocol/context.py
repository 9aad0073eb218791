"""One protocol-mode request as the route hands it over, built once; and the save of the session it leaves.

``PagedRequest`` holds what the driver needs of the request (its codec, its
conversation, its policy, its caller, its telemetry, its extensions' hooks);
``SessionSave`` sends the session it leaves to the store: once when the first
worker call has answered, again with what the request solidified.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from pcp_core import Conversation, Policy, Prepared, Resolution, prompt_tokens
from pcp_core.session import Session

from .. import headers as pcp
from .hooks import Hook, HybridHook, MemoryHook, PactHook
from .telemetry import RequestTelemetry

if TYPE_CHECKING:
    from ..apis.codec import Codec
    from ..memory.scopes import Scope
    from ..services import DenseRecall as Embedder
    from ..services import Services
    from ..storage.sessions import SessionStore

__all__ = ["DenseRecall", "PagedRequest", "SessionSave", "extensions", "paged_headers"]

log = logging.getLogger("pcp.drive")


@dataclass
class PagedRequest:
    """One request in protocol mode, as the route (or a compaction) hands it to the driver."""

    services: Services
    codec: Codec
    conversation: Conversation
    headers: dict[str, str]  # the client's, as they may go upstream
    namespace: str  # the caller's
    policy: Policy
    telemetry: RequestTelemetry
    pinned: str | None = None  # the session the client pins, or one its agent names (``web.routes``)
    hooks: list[Hook] = field(default_factory=list)  # its extensions' (``extensions``)
    behind: list[str] = field(default_factory=list)  # sessions of the caller whose pages it reads beside its own

    @classmethod
    def bare(cls, services: Services, codec: Codec, conversation: Conversation, headers: dict[str, str], namespace: str, policy: Policy) -> PagedRequest:
        """A request with no telemetry of the client's, no pin, and of the extensions PACT's alone (a compaction's paging)."""
        messages = [*conversation.head, *conversation.history, *filter(None, [conversation.query])]
        tokens = prompt_tokens(messages, services.tokenizer.count)
        telemetry = RequestTelemetry(services.traces, services.metrics, namespace, codec.model, tokens, services.controls.default, len(messages))
        return cls(services, codec, conversation, headers, namespace, policy, telemetry, hooks=[PactHook(services.components, namespace, codec)])


def extensions(services: Services, codec: Codec, headers: dict[str, str], namespace: str, scope: Scope | None) -> list[Hook]:
    """The hooks of the extensions a request carries: PACT components always; Hybrid mode where it is on for a chat
    body; memory where the request names a scope."""
    hooks: list[Hook] = [PactHook(services.components, namespace, codec)]
    key = scope.key if scope is not None else None
    turn = services.hybrid.begin(headers, namespace, key) if codec.api.chat_body else None
    if turn is not None:
        hooks.append(HybridHook(turn))
    if scope is not None and services.memory is not None:
        hooks.append(MemoryHook(services.memory, scope, bool(services.settings.router_model)))
    return hooks


class DenseRecall:
    """Dense recall for one request: its query encoded early, similarities when the rounds ask; none without an embedder."""

    def __init__(self, embedder: Embedder | None, headers: dict[str, str]):
        self.embedder, self.headers = embedder, headers
        self.prefetch: Awaitable[Any] | None = None  # the query's vector, encoding

    @property
    def on(self) -> bool:
        """Whether there is an embedder: dense recall joins BM25."""
        return self.embedder is not None

    def serving(self) -> AbstractContextManager[Any]:
        """While the request is served: encoding history texts in the background would take the interpreter from it."""
        return self.embedder.serving() if self.embedder is not None else nullcontext()

    def encode(self, text: str) -> None:
        """Start encoding the query's ``text``, while the history is paged."""
        if self.embedder is not None and text:
            self.prefetch = self.embedder.prefetch(text, self.headers)

    async def similarities(self, query: str, texts: list[str]) -> Any:
        """The texts' similarities to the query, once its vector is ready; None: none (no embedder, or it failed)."""
        if self.embedder is None:
            return None
        if self.prefetch is not None:
            await _quietly(self.prefetch)
        return await _quietly(self.embedder.similarities_when_ready(query, texts, self.headers))


async def _quietly(work: Awaitable[Any]) -> Any:
    """``work``'s result, or None if it fails: dense recall is worth having, never worth a failed request."""
    try:
        return await work
    except Exception:
        log.exception("dense recall is skipped for this request")
        return None


class SessionSave:
    """The session a request leaves, sent to the store: first when a worker call has answered (one the upstream refused
    keeps nothing), while the next round computes; then with what the request solidified, after the first."""

    def __init__(self, sessions: SessionStore, namespace: str, conversation: Conversation, pinned: str | None):
        self.sessions, self.namespace, self.conversation = sessions, namespace, conversation
        self.pinned = pinned is not None  # a session the client pins is kept under its name
        self.kept: Future[Any] | None = None  # the latest save: what the store kept
        self.id = ""  # the session as the store keeps it (a concurrent request may have kept the request's id first)
        self.known = True  # whether ``id`` is known before the store has kept the session (``SessionStore.save``)

    @property
    def sent(self) -> bool:
        """Whether the session's first save has gone."""
        return self.kept is not None

    def first(self, prepared: Prepared, resolution: Resolution) -> None:
        """Send the session to the store, once."""
        if self.kept is not None:
            return
        found = resolution.found
        # Conditional on the version the request read, when it goes on with the session it found.
        base = resolution.version if found is not None and found.id == prepared.session.id else ""
        saved = self.sessions.save(self.namespace, prepared.session, prepared.new_links, self.conversation.chained, base=base, pinned=self.pinned)
        # The id the session is kept under: a branch that a concurrent request left its session's id to goes on in its own.
        self.kept, self.id, self.known = saved.kept, saved.id, saved.known

    def solidified(self, session: Session) -> None:
        """Send ``session`` (the first save's, with the pages its drafts were solidified into), after the first."""
        if self.id and self.id != session.id:  # the first save went on under another id
            session = msgspec.structs.replace(session, id=self.id)
        self.kept = self.sessions.save(self.namespace, session, 0, after=self.kept).kept

    async def stored(self, always: bool = False) -> None:
        """With a shared store, until the session's saves are in it: a follow-up on another process finds them, and
        an answer is complete only once what it paged is kept (a store lost meanwhile is the client's 503). With
        a store of its own, only when the id the session is kept under is not known before (``SessionStore.save``),
        or ``always``."""
        if self.kept is None or (not always and not self.sessions.shared and self.known):
            return
        kept = await asyncio.wrap_future(self.kept)
        if kept is not None:
            self.id = kept.session.id

    def session_id(self, prepared: Prepared | None) -> str:
        """The id the client is told: the store's, else the prepared session's."""
        return self.id or (prepared.session.id if prepared else "")


def paged_headers(scope: Scope | None, tokens: int, reason: str) -> dict[str, str]:
    """The headers every answer of a paged request carries, a refusal's too: its prompt's tokens, its memory scope, why it was paged."""
    return {pcp.PROMPT_TOKENS: str(tokens), pcp.MODE_REASON: reason, **({pcp.MEMORY: scope.name} if scope is not None else {})}
