"""An agent's own compaction, answered from the pages: nothing of the history is lost.

A coding agent that compacts (Claude Code's ``/compact`` and auto-compact,
Codex CLI's compaction where the provider has no ``/responses/compact``) sends
its whole history with one more turn that asks the model for a summary, then
goes on with the summary alone: what the summary leaves out is gone. Such a
request is known by its prompt (``COMPACTION_PROMPTS``). The proxy keeps the
history as the pages of a session instead, with no model call (seconds, where
the agent's own compaction takes a model's whole answer), and answers with
``compaction_text``: the task as first given, the latest turns, and a marker
that carries a handle to the pages (``PAGES_MARKER``). The agent puts the
answer in its history as its summary; a later request that carries the marker
is served in protocol mode with those pages behind it, so that the model can
still read, and consult, every turn the agent dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .conversation import Conversation, message_text
from .text.tokens import CountText, leading_tokens

__all__ = ["COMPACTION_PROMPTS", "PAGES_MARKER", "asks_to_compact", "compaction_text", "marked_handles"]

Message = dict[str, Any]

# The words by which each agent asks for its history's summary, as its installed version sends them.
COMPACTION_PROMPTS = (
    "create a detailed summary of the conversation so far",  # Claude Code
    "CONTEXT CHECKPOINT COMPACTION",  # Codex CLI
)
PAGES_MARKER = "[pcp-pages: {handle}]"
_MARKED = re.compile(r"\[pcp-pages: ([A-Za-z0-9_.\-]+)\]")
# Of the answer: the task as first given, and the latest turns, each at most this many tokens.
TASK_TOKENS, LATEST_TOKENS, TURN_TOKENS = 1000, 1500, 500


def asks_to_compact(conversation: Conversation) -> bool:
    """Whether the request is an agent's compaction of the history before it: its query asks for the summary."""
    query = conversation.query
    return bool(conversation.history) and query is not None and any(prompt in message_text(query) for prompt in COMPACTION_PROMPTS)


def compaction_text(conversation: Conversation, handle: str, count: CountText) -> str:
    """The summary an agent's compaction gets: what its history is now, the task as first given, and the latest turns."""
    history = conversation.history
    task = next((message_text(m) for m in history if m.get("role") == "user" and message_text(m).strip()), "")
    lines = [
        f"Earlier in this conversation: {len(history)} messages, kept whole as pages by the proxy, "
        f"which shows the model those that bear on each later request, and lets it open any of them. {PAGES_MARKER.format(handle=handle)}",
        "",
        "The task, as first given:",
        leading_tokens(task, TASK_TOKENS, count) or "(none)",
        "",
        "The latest turns:",
        *_latest(history, count),
    ]
    return "\n".join(lines)


def marked_handles(text: str) -> list[str]:
    """The handles that the compactions answered by the proxy left in ``text`` (a request's body), in order, once each."""
    return list(dict.fromkeys(_MARKED.findall(text)))


def _latest(history: Sequence[Message], count: CountText) -> list[str]:
    """The history's last turns, oldest first, within ``LATEST_TOKENS``: each cut to ``TURN_TOKENS``."""
    turns: list[str] = []
    left = LATEST_TOKENS
    for message in reversed(history):
        text = message_text(message).strip()
        if not text:
            continue
        turn = f"{message.get('role', 'user')}: {leading_tokens(text, TURN_TOKENS, count)}"
        cost = count(turn)
        if cost > left:
            break
        turns.append(turn)
        left -= cost
    return turns[::-1]
