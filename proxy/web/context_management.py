"""The providers' context management, served by the proxy where the upstream does not: lossless, by paging.

Anthropic's ``context_management`` (``pcp_core.context_edits``) on a Messages
request, where the Messages API has no upstream of its own
(``PCP_ANTHROPIC_BASE_URL``) and is translated to chat completions (or always,
with ``PCP_SERVE_CONTEXT_MANAGEMENT``):

* a clearing edit that fires (``clear_tool_uses_*``, ``clear_thinking_*``) runs
  the request in protocol mode on its whole history, so that what it clears is
  paged in its session, which the model can Consult; what goes upstream is no
  larger than the request its edits leave (the budget is narrowed to it). The
  answer reports ``context_management.applied_edits`` as Anthropic's does.
* ``compact_20260112`` over its trigger runs the request in protocol mode too,
  and hands back one ``compaction`` block first in the answer: the proxy's handle
  (signed with the install's secret, bound to the caller's namespace:
  ``Namespaces.handle``) to the session's pages.
* a request that carries such a block is read from the block on (what is before
  it is dropped, as Anthropic drops it) and runs in protocol mode with the pages
  the handle stands for behind its own.

Where protocol mode cannot take the request (``x-pcp-mode-request: off``, a
budget its head alone fills), the edited request goes upstream as Anthropic
would send it to the model: cleared, and not reported.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pcp_core import EditError, after_compaction, apply_edits, edits_of

from ..apis.messages import Managed
from ..errors import ClientError
from ..protocol.control import Control
from ..services import Services
from ..storage.datadir import HANDLE_PREFIX

__all__ = ["Plan", "plan", "serves_context_management"]

Read = Callable[[bytes], tuple[Any, int, int]]  # a body's reading, its messages' tokens and its prompt's


@dataclass
class Plan:
    """How a Messages request whose context the proxy manages is served."""

    body: bytes  # the request as it is read and paged from here: its whole history (from its compaction on), no edits
    read: tuple[Any, int, int]  # ``body`` read: its ``Reading``, its messages' tokens, its prompt's
    forwarded: bytes  # the request as its edits leave it: what goes upstream where it is not paged
    managed: Managed
    budget: int | None = None  # what the request its edits leave takes: no more goes upstream
    behind: list[str] = field(default_factory=list)  # sessions of the caller whose pages it reads beside its own

    @property
    def forced(self) -> bool:
        """Whether the request must be paged: an edit fired, or it carries pages behind it."""
        return bool(self.managed.applied or self.managed.compaction is not None or self.behind)

    def controlled(self, control: Control) -> Control:
        """``control`` in protocol mode, its budget no larger than what the edited request takes."""
        policy = control.policy
        if self.budget is not None and self.budget < policy.rounds.budget:
            policy = msgspec.structs.replace(policy, rounds=msgspec.structs.replace(policy.rounds, budget=self.budget))
        return msgspec.structs.replace(control, mode="force", policy=policy)


def serves_context_management(services: Services) -> bool:
    """Whether the proxy applies a Messages request's context management: where the upstream that takes it does not
    speak Messages (translated to chat completions), or the settings say it always does."""
    settings = services.settings
    return settings.serve_context_management or (services.anthropic is None and settings.translate_apis != "never")


def plan(services: Services, namespace: str, body: bytes, read: Read) -> Plan | None:
    """How the Messages request ``body`` is served when it carries context management or a compaction block; None:
    as any other (nothing asked, or nothing fired)."""
    if b'"context_management"' not in body and b'"compaction"' not in body:
        return None
    try:
        asked = json.loads(body)
    except ValueError:
        return None  # the reading says what is wrong with it
    if not isinstance(asked, dict) or not isinstance(asked.get("messages"), list):
        return None
    try:
        edits = edits_of(asked.get("context_management"))
    except EditError as error:
        raise ClientError(str(error), param=error.param) from None
    held, messages = after_compaction(asked["messages"])
    behind: list[str] = []
    if held is not None and held.startswith(HANDLE_PREFIX):
        opened = services.namespaces.opened(namespace, held)
        if opened is None:
            raise ClientError(
                "the compaction block was not made by this proxy for this caller: its pages cannot be read (send the history it stands for instead)",
                param="messages",
                code="invalid_compaction",
            )
        behind = opened
    elif held is not None:  # another's compaction (Anthropic's summary): its text stands for what it compacted
        messages = [{"role": "user", "content": [{"type": "text", "text": held}]}, *messages]
    whole = {k: v for k, v in asked.items() if k != "context_management"}
    whole["messages"] = messages
    body = json.dumps(whole).encode()
    reading = read(body)
    count = services.tokenizer.count
    edited = apply_edits(messages, edits, reading[2], count)
    if not (edited.applied or edited.compaction is not None or behind):
        return None
    forwarded = json.dumps({**whole, "messages": edited.messages}).encode()
    budget = None
    if edited.applied:
        budget = read(forwarded)[2]
    managed = Managed(edited.applied, edited.compaction, lambda sessions: services.namespaces.handle(namespace, sessions))
    return Plan(body, reading, forwarded, managed, budget, behind)
