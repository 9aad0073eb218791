"""A chat request's messages read as a conversation: its head, its history and its query.

The head (the leading system and developer messages) is kept as it is, so a
system prompt that changes on every call (today's date in it, say) does not
break the session; the history is what is paged; the last message is the
query. A query too large for a prompt (a file pasted with its question) is a
File block too: the session takes it as its next message, scanned.

Two shapes of coding agents' requests are read so that the query stays what
was asked:

* system or developer messages after the last turn (Claude Code's
  mid-conversation system message, a reminder appended to the request) are
  instructions, not the query: they join the head;
* a chat conversation that ends in tool results (``role: "tool"``) ends in
  one turn, the assistant's calls and the results that answer them (as
  ``exchanges`` reads the other APIs): the query is that turn, so the worker
  reads what was asked and what came back together.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgspec

from .pages.blocks import ScanPolicy
from .pages.logical import short_hash
from .text.tokens import CountText, function_calls, part_text

__all__ = [
    "HEAD_ROLES",
    "PLACEHOLDER",
    "Conversation",
    "attached",
    "conversation_end",
    "exchange_start",
    "exchange_turn",
    "fold_system",
    "message_text",
    "part_handle",
    "parts_of",
    "placeholder",
    "query_shown",
]

HEAD_ROLES = ("system", "developer")

Message = dict[str, Any]


class Conversation(msgspec.Struct, frozen=True):
    head: list[Message]
    history: list[Message]
    query: Message | None  # the last message, None when the request holds only a head
    query_is_block: bool = False  # the query is paged apart as a File block (``pcp_core.pages.blocks``)
    # The messages the query was sent as, when it is not one of them (a turn of calls and their results):
    # a follow-up sends them back as they came.
    query_sent: list[Message] = []

    @classmethod
    def of(cls, messages: Sequence[Message], blocks: ScanPolicy, count: CountText, shown: int = 0) -> Conversation:
        """``messages`` read as a head, a history and a query. A query longer than ``blocks`` says is paged apart as a
        File block, unless it is within ``shown`` tokens (``query_shown``): a prompt of that budget shows it whole."""

        def apart(text: str) -> bool:
            """Whether a message of ``text`` is paged apart as a File block."""
            return blocks.is_block(text, count) and not (shown and count(text) <= shown)

        start = conversation_start(messages)
        end = conversation_end(messages, start)
        head, rest = [*messages[:start], *messages[end:]], list(messages[start:end])
        exchange = exchange_start(rest)
        if exchange is not None:
            turn = exchange_turn(rest[exchange:])
            # A turn too large for a prompt stays as it came: the session holds a File-block query
            # as the one message it is, and the next request sends the same message back.
            if not apart(message_text(turn)):
                return cls(head=head, history=rest[:exchange], query=turn, query_sent=rest[exchange:])
        query = rest[-1] if rest else None
        block = query is not None and apart(message_text(query))
        return cls(head=head, history=rest[:-1], query=query, query_is_block=block)

    @property
    def chained(self) -> list[Message]:
        """The messages the session's chain links: the history, and the query when the session takes it."""
        return [*self.history, self.query] if self.query_is_block and self.query is not None else self.history

    @property
    def sent_before(self) -> int:
        """How many of the history's messages a client resending the conversation sent before this request: those
        before its latest answer, where the request before it ended. A query that is an answer itself (tool calls
        and their results, as one turn) comes after the whole history."""
        messages = [*self.history, *filter(None, [self.query])]
        last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), 0)
        return min(last, len(self.history))

    @property
    def head_text(self) -> str:
        """The head's text: its system and developer messages."""
        return "\n\n".join(message_text(m) for m in self.head)

    @property
    def opening_text(self) -> str:
        """The client's first message when the history starts with it as text: a worker prompt opens with it as
        sent, after the head, so a provider's cache finds the prefix the client's own requests made."""
        first = self.history[0] if self.history else None
        return first["content"] if first is not None and first.get("role") == "user" and isinstance(first.get("content"), str) else ""

    @property
    def query_text(self) -> str:
        """The query's text ('' without one)."""
        return message_text(self.query) if self.query is not None else ""

    @property
    def query_parts(self) -> list[Any]:
        """The query's parts that are not text (images, audio, files): the worker gets them as they came."""
        return list(parts_of(self.query)) if self.query is not None else []

    def history_parts(self) -> dict[str, Any]:
        """The history's parts that are not text, by handle: what a Consult on the page that shows one sends again."""
        listed = [m for m in self.history if isinstance(m.get("content"), list)]  # a text's message has none: one pass in C
        return {part_handle(part): part for message in listed for part in parts_of(message)}


def conversation_start(messages: Sequence[Mapping[str, Any]]) -> int:
    """Where the conversation starts: after the head, the leading system and developer messages."""
    return next((i for i, m in enumerate(messages) if m.get("role") not in HEAD_ROLES), len(messages))


def conversation_end(messages: Sequence[Mapping[str, Any]], start: int) -> int:
    """Where the conversation ends: before the system and developer messages that follow its last turn."""
    end = len(messages)
    while end > start and messages[end - 1].get("role") in HEAD_ROLES:
        end -= 1
    return end


def exchange_start(messages: Sequence[Mapping[str, Any]]) -> int | None:
    """Where the turn starts whose calls the chat tool results that end ``messages`` answer (the assistant's
    message with ``tool_calls``); None when they do not end in tool results, or the calls are not there."""
    i = len(messages)
    while i > 0 and messages[i - 1].get("role") == "tool":
        i -= 1
    if i == len(messages) or i == 0 or messages[i - 1].get("role") != "assistant" or not function_calls(messages[i - 1]):
        return None
    return i - 1


def exchange_turn(messages: Sequence[Mapping[str, Any]]) -> Message:
    """An assistant's message with its calls and the tool messages that answer them, as one turn:
    ``Let me look. (calls read({…})) (read returned: …)``, a result's attachments after its text."""
    calls, names = messages[0], {}
    for call in calls.get("tool_calls") or ():
        if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
            names[call.get("id")] = call["function"].get("name")
    content: list[Any] = [{"type": "text", "text": message_text(calls).strip()}]
    for result in messages[1:]:
        name = names.get(result.get("tool_call_id")) or result.get("name") or "a tool"
        returned = message_text({**result, "name": None})
        content += [{"type": "text", "text": f"({name} returned: {returned})"}, *parts_of(result)]
    return {"role": "assistant", "content": content}


# Of a worker call's budget, the most a query may take and still be shown whole: the latest tool output an agent's
# step answers, a pasted document with its question. Past it, or past what a page holds where the budget is small,
# the query is paged apart (``pcp_core.pages.blocks``) and the model reads its start and end and Consults the rest.
QUERY_SHARE = 2  # a half


def query_shown(budget: int) -> int:
    """The most tokens of a query that a worker call of ``budget`` shows whole."""
    return budget // QUERY_SHARE


def message_text(message: Mapping[str, Any]) -> str:
    """The readable text of a chat message: content parts, tool calls and results."""
    content = message.get("content")
    if isinstance(content, list):
        text = " ".join(filter(None, map(_part_text, content)))
    else:
        text = content if isinstance(content, str) else ""
    for name, arguments in function_calls(message):
        text += f"\n(calls {name or '?'}({arguments}))"
    if message.get("name"):
        text = f"{message['name']}: {text}"
    return text


def _part_text(part: Any) -> str:
    """A content part's text; a part of another kind (an image, audio, a file) by its placeholder."""
    text = part_text(part)
    return placeholder(part) if text is None else text


def parts_of(message: Mapping[str, Any]) -> Iterator[Any]:
    """The parts of ``message`` that are not text."""
    content = message.get("content")
    if isinstance(content, list):
        yield from (part for part in content if part_text(part) is None)


def part_handle(part: Any) -> str:
    """A part's handle: a hash of what it holds, so the same image resent is the same handle in every request."""
    return short_hash(msgspec.json.encode(part, order="sorted").decode())


def placeholder(part: Any) -> str:
    """What a page says in place of a part: its kind and its handle ("[image_url 3f2a9c1d]")."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    return f"[{kind if isinstance(kind, str) and _KIND.fullmatch(kind) else 'part'} {part_handle(part)}]"


_KIND = re.compile(r"[a-z_]{1,32}")
PLACEHOLDER = re.compile(r"\[[a-z_]{1,32} ([0-9a-f]{8})\]")


def attached(text: str, parts: Sequence[Any]) -> str | list[Any]:
    """A message's content: ``text``, and after it each part with its placeholder before it, as the page names it."""
    if not parts:
        return text
    content: list[Any] = [{"type": "text", "text": text}]
    for part in parts:
        content += [{"type": "text", "text": placeholder(part)}, part]
    return content


def fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` for an upstream that ignores system messages: the leading ones' text opens the first user message."""
    start = conversation_start(messages)
    if not start or start == len(messages) or messages[start].get("role") != "user":
        return messages
    system_text = "\n\n".join(message_text(m) for m in messages[:start])
    first = messages[start]
    content = first.get("content")
    folded = f"{system_text}\n\n{content}" if isinstance(content, str) else [{"type": "text", "text": system_text}, *(content or [])]
    return [{**first, "content": folded}, *messages[start + 1 :]]
