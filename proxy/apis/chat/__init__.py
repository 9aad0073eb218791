"""The chat-completions API: its requests read and its answers written (``codec``), its streams' chunks (``chunks``)."""

from .codec import CHAT, ChatCodec, ChatRequest, ChatRound, ChatRules, check, check_chunk, event, failure, read, relayed_finish

__all__ = ["CHAT", "ChatCodec", "ChatRequest", "ChatRound", "ChatRules", "check", "check_chunk", "event", "failure", "read", "relayed_finish"]
