"""Whether a request is paged, forwarded as it came, or refused: one decision, with its reason.

The host reads the request and counts it; the rules decide here::

    decision = decide(Asked(mode, policy, tokens, carried, ...), fits)

``fits(policy)`` says whether the request can be paged under ``policy``
(``request.pageable``: the host builds the conversation only when asked). The
reason is one word the host may show its client (``REASONS``): a request that
asked to be paged and was not says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import msgspec

from .request import Policy, engaged, within_conversation, within_window

__all__ = ["REASONS", "Asked", "Decision", "Managed", "Passthrough", "Protocol", "Reason", "Refuse", "decide"]

Reason = Literal[
    "unread",
    "no-messages",
    "off",
    "below-threshold",
    "cheaper-untouched",
    "budget-full",
    "forced",
    "threshold",
    "memory",
    "context-management",
    "compaction",
    "refused-untouched",
    "agent-compaction",
    "too-large",
]

Managed = Literal["", "context-management", "compaction"]

# What each reason says, for the host's documentation and its log.
REASONS: dict[str, str] = {
    "unread": "the request leans on state the proxy cannot see (a stored response, a server-side conversation)",
    "no-messages": "the request carries no messages",
    "off": "the request asked for passthrough (x-pcp-mode-request: off)",
    "below-threshold": "the prompt is at or below the threshold",
    "cheaper-untouched": "above the threshold, but it fits the model's window and paging would cost more",
    "budget-full": "its query and attachments alone fill the context budget: no room for pages",
    "forced": "the request asked to be paged (x-pcp-mode-request: force)",
    "threshold": "the prompt is above the threshold",
    "memory": "its memory scope holds pages, which are brought in",
    "context-management": "context management the proxy applies pages it",
    "compaction": "it carries a compaction the proxy made: its pages are read in protocol mode",
    "refused-untouched": "sent untouched, the upstream refused it as longer than its model's window: paged within the window it named",
    "agent-compaction": "an agent's compaction of its history, answered from the pages with no model call",
    "too-large": "no room for pages in the budget, and larger than the model's window",
}


class Passthrough(msgspec.Struct, frozen=True):
    """Forwarded as it came."""

    reason: Reason


class Protocol(msgspec.Struct, frozen=True):
    """Paged, under ``policy`` (the request's, or its budget widened until it pages)."""

    reason: Reason
    policy: Policy


class Refuse(msgspec.Struct, frozen=True):
    """Neither: it cannot be paged and the model's window cannot hold it."""

    reason: Reason
    policy: Policy


Decision = Passthrough | Protocol | Refuse


class Asked(msgspec.Struct, frozen=True, kw_only=True):
    """What the rules read of a request to decide how it goes."""

    mode: Literal["auto", "off", "force"]
    policy: Policy
    tokens: int = 0  # its prompt's, with its tool definitions
    carried: int = 0  # of them, its head's (``request.head_tokens``)
    readable: bool = True  # the proxy can read its whole conversation
    messages: bool = True  # it carries messages
    faults: bool = False  # its memory scope holds pages
    # The proxy applies its context management (``context-management``), or it carries a compaction (``compaction``).
    managed: Managed = ""
    budget: int | None = None  # with ``managed``: the budget no larger than what the request its edits leave takes
    most: int | None = None  # with ``managed``: the most its budget may widen to (None: what it takes beside its head)
    refused: bool = False  # sent untouched, it was refused as longer than its model's window


def decide(asked: Asked, fits: Callable[[Policy], bool]) -> Decision:
    """How the request goes: the mode it asks for and the Sentry's threshold, then whether the budget has room for pages."""
    first = _mode(asked)
    if isinstance(first, Passthrough):
        return first
    policy = first.policy
    if fits(policy):
        return first
    if asked.managed:  # its edits are paged, not applied by dropping what they clear: the budget widens until it pages
        widened = _widened(asked, policy, fits)
        if widened is not None:
            return Protocol(first.reason, widened)
    if policy.window and asked.tokens > policy.window:
        return Refuse("too-large", policy)
    return Passthrough("budget-full")


def _mode(asked: Asked) -> Passthrough | Protocol:
    """The mode before the budget is measured: the request's headers, what it carries, the Sentry."""
    if not asked.readable:
        return Passthrough("unread")
    if not asked.messages:
        return Passthrough("no-messages")
    if asked.mode == "off":
        return Passthrough("off")
    policy = within_window(asked.policy, asked.carried) if asked.policy.window else asked.policy
    policy = within_conversation(policy, asked.tokens - asked.carried)
    if asked.managed:
        if asked.budget is not None and asked.budget < policy.rounds.budget:
            policy = policy.with_rounds(budget=asked.budget)
        return Protocol(asked.managed, policy)
    if asked.refused:
        return Protocol("refused-untouched", policy)
    if asked.mode == "force":
        return Protocol("forced", policy)
    if engaged(asked.tokens, policy, asked.carried):
        return Protocol("threshold", policy)
    if asked.faults:
        return Protocol("memory", policy)
    return Passthrough("below-threshold" if asked.tokens <= policy.threshold else "cheaper-untouched")


def _widened(asked: Asked, policy: Policy, fits: Callable[[Policy], bool]) -> Policy | None:
    """A budget the query and its attachments alone fill, doubled until the request pages: up to what the request its
    edits leave takes beside its head, and what the model's window leaves beside the head; None: it never does."""
    most = asked.most if asked.most else asked.tokens - asked.carried
    window = policy.window
    most = min(most, max(window - asked.carried, 0)) if window else most
    budget = policy.rounds.budget
    while budget < most:
        budget = min(budget * 2, most)
        widened = policy.with_rounds(budget=budget)
        if fits(widened):
            return widened
    return None
