"""A request of a paged API as it arrives: read once, counted once, decided once (``pcp_core.decision``).

``Arrival`` is the request's context, built once: its API, its body as the
proxy reads it (its context management applied: ``context_management``), its
counts, its memory scope, and its caller's namespace, computed at most once and
only when something needs it (a keyed hash). ``decided`` says how it goes;
``handed_over`` builds what protocol mode is given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

from litestar import Request

from pcp_core import Conversation, Policy, client_named, pageable, prompt_tokens
from pcp_core.conversation import conversation_start, query_shown
from pcp_core.decision import Asked, Decision, Managed, Protocol, decide

from .. import headers as pcp
from ..apis.chat import CHAT
from ..apis.codec import Api, Codec, Reading, tools_text, whole_body
from ..apis.messages import MESSAGES, MessagesCodec
from ..memory.hooks import memory_scope, scope_has_pages
from ..memory.scopes import Scope
from ..protocol.context import PagedRequest, extensions
from ..protocol.control import Control
from ..protocol.telemetry import RequestTelemetry
from ..services import Services
from .agent_compaction import COMPACTING, MARKED, marked_behind
from .context_management import Plan, plan, responses_plan, serves_context_management
from .keys import upstream_headers

__all__ = ["LARGE_BODY", "Arrival", "Counted", "arrive", "read_api", "read_large"]

T = TypeVar("T")

log = logging.getLogger("pcp.proxy")

# A body over this is read (decoded, counted, its conversation found) in a thread: at a million
# tokens that is time of the event loop's that the requests it serves meanwhile would wait for (bench/mixed_load.py).
LARGE_BODY = 256 * 1024


class Counted(NamedTuple):
    """A body as its API reads it, and its counts."""

    reading: Reading
    message_tokens: int  # its messages' (0: one forwarded untouched, which is not counted)
    tokens: int  # its prompt's: its messages' and its tool definitions'
    carried: int  # its head's, which a worker call carries whole (``head_tokens``)


@dataclasses.dataclass
class Arrival:
    """One request of a paged API, as the proxy reads it."""

    services: Services
    api: Api  # at the path the client asked for (``asked_at``)
    client_headers: Mapping[str, str]  # as the client sent them
    headers: dict[str, str]  # as they may go upstream (the control headers taken out once read)
    body: bytes  # as it is read and paged from here
    counted: Counted
    plan: Plan | None = None  # the context management the proxy applies to it
    behind: list[str] = dataclasses.field(default_factory=list)  # sessions whose pages it reads beside its own
    scope: Scope | None = None  # its memory scope (``proxy.memory``)
    refused: bool = False  # forwarded untouched before, it was refused as longer than its model's window (``protocol.refusals``)
    conversation: Conversation | None = None  # as the rules read it, once it is known to be one to page
    codec: Codec | None = None

    @cached_property
    def namespace(self) -> str:
        """The caller's namespace (a keyed hash), computed once, when something needs it."""
        return self.services.namespaces.of(self.client_headers)

    @property
    def forwarded(self) -> bytes:
        """The body that goes upstream when it is not paged: as its context management's edits leave it."""
        return self.plan.forwarded if self.plan is not None else self.body

    def decided(self, measured: bool = True) -> Decision:
        """How the request goes (``pcp_core.decision.decide``): its model's control narrowed by its headers, its memory, its
        size; unless ``measured``, whatever room the budget leaves (a token count's)."""
        reading, counted = self.counted.reading, self.counted
        if reading.unreadable is not None or not reading.messages:
            return decide(Asked(mode="auto", policy=self.services.policy, readable=reading.unreadable is None, messages=False), _never)
        control = self.services.controls.of(self.headers, reading.model)
        managed: Managed = "context-management" if self.plan is not None else "compaction" if self.behind else ""
        budget = self.plan.budget if self.plan is not None else None
        asked = Asked(
            mode=control.mode,
            policy=control.policy,
            tokens=counted.tokens,
            carried=counted.carried,
            faults=control.mode == "auto" and scope_has_pages(self.services.memory, self.scope),
            managed=managed,
            budget=budget,
            most=budget,
            refused=self.refused,
        )
        return decide(asked, self._pageable if measured else _always)

    @property
    def compacting(self) -> bool:
        """Whether the request may be an agent's compaction of its history (``agent_compaction``): it carries one's prompt."""
        reading = self.counted.reading
        return reading.unreadable is None and bool(reading.messages) and any(prompt in self.body for prompt in COMPACTING)

    def read_conversation(self, policy: Policy, keep: bool = True) -> tuple[Codec, Conversation]:
        """The request's codec, and its conversation as the rules read it under ``policy``: built the first time they are
        asked for, and (``keep``) kept for the request's paging."""
        if self.codec is not None and self.conversation is not None:
            return self.codec, self.conversation
        reading = self.counted.reading
        # Its fields but the messages (decoded already) from what is left of it once the messages read before are known.
        codec = self.api.codec(whole_body(self.body if reading.rest is None else reading.rest, self.api.read_fields, reading.decoded))
        codec.api = self.api
        conversation = Conversation.of(reading.messages, policy.paging.blocks, self.services.tokenizer.count, query_shown(policy.rounds.budget))
        if keep:
            self.codec, self.conversation = codec, conversation
        return codec, conversation

    def _pageable(self, policy: Policy) -> bool:
        """Whether the request can be paged under ``policy``."""
        return pageable(self.read_conversation(policy)[1], policy, self.services.tokenizer.count)

    def handed_over(self, decision: Protocol) -> PagedRequest:
        """What protocol mode is given of the request, built once."""
        services, conversation, codec = self.services, self.conversation, self.codec
        assert conversation is not None and codec is not None  # built when the decision measured the budget
        if self.plan is not None and isinstance(codec, MessagesCodec):
            codec.managed = self.plan.managed
        control = Control("auto" if decision.reason in ("threshold", "memory") else "force", decision.policy)
        messages = len(conversation.head) + len(conversation.history) + (conversation.query is not None)
        # The tokens of the request's messages, when they are the conversation's (0: some were merged into one turn,
        # a chat exchange's calls and results: their sum is not the conversation's).
        message_tokens = self.counted.message_tokens if messages == len(self.counted.reading.messages) else 0
        telemetry = RequestTelemetry(services.traces, services.metrics, self.namespace, codec.model, self.counted.tokens, control, messages, message_tokens)
        hooks = extensions(services, codec, self.headers, self.namespace, self.scope)
        return PagedRequest(services, codec, conversation, self.headers, self.namespace, decision.policy, telemetry, self._pinned(), hooks, self.behind)

    def _pinned(self) -> str | None:
        """The session the client pins (``x-pcp-session``); else, for a coding agent that names its own session,
        the one that agent session and conversation keep (``pcp_core.client_named``); else None: found by content."""
        assert self.conversation is not None
        named = pcp.client_session(self.client_headers)
        first = [*self.conversation.history, self.conversation.query][0]
        return pcp.pinned_session(self.client_headers) or (client_named(named, first) if named else None)


def _always(policy: Policy) -> bool:
    """Any budget fits (a count of what the proxy would send does not measure it)."""
    return True


def _never(policy: Policy) -> bool:
    """No budget fits: a request that is not one to page is never measured."""
    return False


async def arrive(request: Request[Any, Any, Any], services: Services, api: Api) -> Arrival:
    """The request read by ``api`` and counted, its context management applied, its memory scope known."""
    headers = upstream_headers(services.settings, request.headers, anthropic=api is MESSAGES)
    api = asked_at(api, request)
    body = await request.body()
    arrival = Arrival(services, api, request.headers, headers, body, Counted(Reading([]), 0, 0, 0))
    if api.name == "messages" and serves_context_management(services):  # its context management, applied here
        arrival.plan = await read_large(body, lambda: plan(services, arrival.namespace, body, lambda edited: read_api(api, edited, services)))
        arrival.behind = arrival.plan.behind if arrival.plan is not None else []
    elif api.name == "responses":  # compaction items the proxy made: their pages behind the request
        opened = await read_large(body, lambda: responses_plan(services, arrival.namespace, body))
        if opened is not None:
            arrival.body, arrival.behind = opened
    if not arrival.behind and MARKED in arrival.body:  # the markers of compactions answered here: their pages behind the request
        arrival.behind = marked_behind(services, arrival.namespace, arrival.body)
    if arrival.plan is not None:
        arrival.body, arrival.counted = arrival.plan.body, Counted(*arrival.plan.read)
    else:
        arrival.counted = await read_large(arrival.body, lambda: read_api(api, arrival.body, services))
    if arrival.counted.reading.unreadable is None:
        arrival.scope = memory_scope(services.memory, request.headers, arrival.body, lambda: arrival.namespace, services.settings.memory_scope_from_user)
    return arrival


def asked_at(api: Api, request: Request[Any, Any, Any]) -> Api:
    """``api`` at the path the client asked for: with its query string (Anthropic's SDK adds ``?beta=true``,
    Azure's ``?api-version=…``), which every upstream call made for the request carries, in both modes."""
    query = request.scope.get("query_string") or b""
    return dataclasses.replace(api, path=f"{api.path}?{query.decode('latin-1')}") if query else api


async def read_large(body: bytes, read: Callable[[], T]) -> T:
    """``read()``: in a thread when ``body`` is over ``LARGE_BODY``, so the requests the event loop serves meanwhile do not wait for it."""
    return await asyncio.to_thread(read) if len(body) > LARGE_BODY else read()


def read_api(api: Api, body: bytes, services: Services) -> Counted:
    """The request as ``api`` reads it, and its counts (``Counted``). A chat body that resends the messages of one
    read before decodes and counts only those it adds (``apis.known_bodies``)."""
    count = services.tokenizer.count
    if api.read is CHAT.read:
        reading, message_tokens = services.bodies.read(body, count)
    else:
        reading = api.read(body)
        if reading.unreadable is not None:
            return Counted(reading, 0, 0, 0)
        message_tokens = prompt_tokens(reading.messages, count)
    tools = tools_text(body if reading.rest is None else reading.rest)
    tools_tokens = count(tools) if tools else 0
    head = reading.messages[: conversation_start(reading.messages)]  # the leading system and developer messages
    return Counted(reading, message_tokens, message_tokens + tools_tokens, (prompt_tokens(head, count) if head else 0) + tools_tokens)
