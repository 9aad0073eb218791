"""OpenAI's Responses API (``POST /v1/responses``): its wire format (``wire``), its conversation read as chat
(``conversation``), protocol mode's codec (``codec``), and its translation to chat completions (``chat_request``,
``chat_answer``) for an upstream that speaks only those."""

from .codec import RESPONSES, ResponsesCodec, ResponsesRound
from .conversation import responses_messages
from .wire import ResponsesRules, check, failure, read, reply, usage, usage_of

__all__ = ["RESPONSES", "ResponsesCodec", "ResponsesRound", "ResponsesRules", "check", "failure", "read", "reply", "responses_messages", "usage", "usage_of"]
