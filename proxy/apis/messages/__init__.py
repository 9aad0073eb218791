"""Anthropic's Messages API (``POST /v1/messages``): its wire format (``wire``), its conversation read as chat
(``conversation``), protocol mode's codec (``codec``), and its translation to chat completions (``chat_request``,
``chat_answer``) for an upstream that speaks only those."""

from .codec import MESSAGES, Managed, MessagesCodec, MessagesRound
from .conversation import anthropic_messages
from .wire import MessagesRules, check, failure, read, reply, usage, usage_of

__all__ = [
    "MESSAGES",
    "Managed",
    "MessagesCodec",
    "MessagesRound",
    "MessagesRules",
    "anthropic_messages",
    "check",
    "failure",
    "read",
    "reply",
    "usage",
    "usage_of",
]
