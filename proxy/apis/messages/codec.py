"""Anthropic's Messages API in protocol mode: a request's worker calls, and the answer the client gets.

Worker calls go upstream as Messages calls (to ``PCP_ANTHROPIC_BASE_URL`` when
set, with the client's ``x-api-key`` and ``anthropic-version``): the client's
system prompt as ``system``; one user message, the client's first message,
the ``<PagedContext>`` and the user line. The client gets one message, or its
events (``MessagesRound``).

Prompt caching: the client's ``cache_control`` marks are kept where the prompt
still has what they mark (its tools, an image or document sent again). Its
system prompt, its first message and the ``<PagedContext>``'s
``<Static_Registry>`` open every worker prompt of a request. The proxy marks
that prefix, and the longer one a later round keeps in place (``_context``),
while the request has marks to spare (Anthropic takes four).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import msgspec

from pcp_core import Compaction, Outcome, part_handle

from ...sse import named_event
from ..codec import Api, ToolsCodec, Usage, function_call, split_system
from .conversation import MARK, unmarked
from .wire import (
    MessagesRules,
    as_stream,
    block_start,
    block_stop,
    check,
    failure,
    message_end,
    message_start,
    new_message_id,
    read,
    relayed_stop,
    reply,
    text_delta,
    usage,
    usage_of,
)

__all__ = ["MESSAGES", "Managed", "MessagesCodec", "MessagesRound"]

Block = dict[str, Any]
MAX_MARKS = 4  # cache_control marks Anthropic takes in one request
OWN_MARK = {"type": "ephemeral"}


def _marks(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The client's marks on its attachments, by the handle of what they mark."""
    marks: dict[str, Any] = {}
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and MARK in block and block.get("type") != "text":
                marks[part_handle(unmarked(block))] = block[MARK]
    return marks


class Managed(msgspec.Struct, frozen=True):
    """The context management the proxy applies for a request: the edits it reports, the compaction it hands back
    (``handle``: the signed, caller-bound handle of the sessions it stands for)."""

    applied: list[dict[str, Any]]
    compaction: Compaction | None
    handle: Callable[[list[str]], str]


class MessagesCodec(ToolsCodec):
    """One Messages request in protocol mode: its worker calls, and the answer it gets."""

    own_fields = ("messages", "system", "stream", "tools", "tool_choice", "pcp_components")
    check = staticmethod(check)
    reply = staticmethod(reply)
    usage = staticmethod(usage)
    rules = MessagesRules

    def __init__(self, body: dict[str, Any]):
        super().__init__(body)
        self.api = MESSAGES
        self.marks = _marks(body.get("messages") or [])
        self.tool_marks = sum(isinstance(tool, dict) and MARK in tool for tool in self.tools)
        # The context management the proxy applies for the request (``web.context_management``), and the
        # compaction block it hands back (once the session is kept, ``kept``).
        self.managed: Managed | None = None
        self.compaction: Block | None = None

    def kept(self, session_id: str, behind: list[str]) -> None:
        """Once the session is kept: the compaction block that hands it back, where the request compacts."""
        if self.managed is not None and self.managed.compaction is not None and session_id:
            handle = self.managed.handle([session_id, *behind])
            self.compaction = {"type": "compaction", "content": handle, "encrypted_content": handle}

    @property
    def paused(self) -> bool:
        """Whether the answer is the compaction block alone (``pause_after_compaction``)."""
        managed = self.managed
        return self.compaction is not None and managed is not None and managed.compaction is not None and managed.compaction.pause_after_compaction

    def managed_fields(self) -> dict[str, Any]:
        """``context_management`` as Anthropic reports it, where the proxy applied the request's."""
        return {"context_management": {"applied_edits": self.managed.applied}} if self.managed is not None else {}

    def router_body(self, messages: list[dict[str, Any]], model: str, max_tokens: int) -> bytes:
        """A call of the router model as a Messages call: at temperature 0, ``max_tokens`` at most."""
        return msgspec.json.encode({"model": model, "max_tokens": max_tokens, "temperature": 0, **self.prompt(messages)})

    def cache_key(self, key: str) -> None:
        """Anthropic finds a prefix by the marks (``_context``): there is no key to send."""

    def prompt(self, messages: list[dict[str, Any]], cuts: Sequence[int] = (), marks: Sequence[int] = ()) -> dict[str, Any]:
        """A call's chat messages as ``system`` and ``messages``, with the client's marks that still apply, then the proxy's own."""
        system, rest = split_system(messages)
        room = [MAX_MARKS - self.tool_marks]
        turns = [{"role": m["role"], "content": self._marked(m["content"], room)} for m in rest]
        if turns:  # the last holds the document
            turns[-1]["content"] = _context(turns[-1]["content"], room[0], cuts, marks)
        prompt: dict[str, Any] = {"messages": turns}
        if system:
            prompt["system"] = system
        return prompt

    def _marked(self, content: Any, room: list[int]) -> Any:
        """``content`` with each attachment the client marked marked again, while marks are left (``room``)."""
        if not isinstance(content, list) or not self.marks:
            return content
        marked = []
        for part in content:
            mark = self.marks.get(part_handle(part)) if isinstance(part, dict) and part.get("type") != "text" else None
            if mark is not None and room[0] > 0:
                room[0] -= 1
                part = {**part, MARK: mark}
            marked.append(part)
        return marked

    def final(self, message: dict[str, Any], outcome: Outcome, usage: Usage) -> dict[str, Any]:
        """The message the client gets: the answer as one text block (a call of its own tools as it came), the answering call's usage."""
        final = {**message, "usage": usage_of(usage), **self.managed_fields()}
        if outcome.kind == "answer":
            final.update(content=[{"type": "text", "text": outcome.text}], stop_reason=relayed_stop(message.get("stop_reason")))
        if self.compaction is not None:  # the history before the answer, handed back as one block
            paused = self.paused
            final["content"] = [self.compaction] if paused else [self.compaction, *(final.get("content") or [])]
            if paused:
                final["stop_reason"] = "compaction"
        return final

    def round(self, usage: Usage) -> MessagesRound:
        """One streamed worker call, read and written as Anthropic's events."""
        return MessagesRound(self, usage)

    @staticmethod
    def chat_tool(tool: Block) -> dict[str, Any]:
        """A client's tool as the rounds read it: a function by name (its definition counted for the budget);
        a server tool (web_search, …) as it is: the upstream runs it, so it never ends the loop."""
        if isinstance(tool.get("name"), str) and "input_schema" in tool:
            return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""), "parameters": tool["input_schema"]}}
        return tool

    @staticmethod
    def directive_tool(function: dict[str, Any]) -> dict[str, Any]:
        """A directive's function as a Messages tool."""
        return {"name": function["name"], "description": function["description"], "input_schema": function["parameters"]}


def _context(content: Any, room: int, cuts: Sequence[int] = (), marks: Sequence[int] = ()) -> Any:
    """A worker call's user message: the text that holds the ``<PagedContext>`` in blocks (``_blocks``), then its parts."""
    if isinstance(content, str):
        return _blocks(content, room, cuts, marks)
    if isinstance(content, list) and content and isinstance(content[0], dict) and content[0].get("type") == "text":
        blocks = _blocks(content[0]["text"], room, cuts, marks)
        return [*(blocks if isinstance(blocks, list) else [content[0]]), *content[1:]]
    return content


def _blocks(text: str, room: int, cuts: Sequence[int] = (), marks: Sequence[int] = ()) -> str | list[Block]:
    """The text that holds the ``<PagedContext>``, in blocks the proxy marks for Anthropic's cache while ``room`` is left.

    Anthropic caches a prefix only where a mark is, and finds an earlier entry
    only at a block's end (up to 20 blocks back from a mark). The client's
    first message and the ``<Static_Registry>`` (the instructions) open every
    worker prompt; ``cuts`` are where the entries of earlier calls end and
    where those of later ones will (``CallWorker.cuts``), so each is a block's
    end; ``marks`` are those worth an entry, the most valuable first (the
    longest prefix a later round keeps, the frame a follow-up replays), then
    the registry while marks are left.
    """
    end = text.find("</Static_Registry>")
    if room <= 0 or end < 0:
        return text
    registry = text.find("\n", end) + 1 or len(text)
    bounds = sorted({registry, *(cut for cut in cuts if registry < cut < len(text))})
    wanted = [*(bounds.index(cut) for cut in marks if cut in bounds), 0] if marks else [len(bounds) - 1, 0]
    marked = set(list(dict.fromkeys(wanted))[:room])
    blocks: list[Block] = [
        {"type": "text", "text": text[a:b], **({MARK: OWN_MARK} if i in marked else {})} for i, (a, b) in enumerate(zip([0, *bounds], bounds))
    ]
    return [*blocks, {"type": "text", "text": text[bounds[-1] :]}] if text[bounds[-1] :] else blocks


# -- a streamed call: the upstream's events read, the client's written ---------------------


class MessagesRound:
    """The client's stream is the one a message of one text block would have: ``message_start`` (a compaction
    block first, where the history was compacted), the block and its text as the answer is released, then
    ``message_delta`` with the answering call's usage. A call of the client's own tools is replayed."""

    def __init__(self, codec: MessagesCodec, usage: Usage):
        self.codec = codec
        self.usage = usage
        self.tool_calls: dict[int, dict[str, Any]] = {}
        # The upstream's message as message_start tells it, and how message_delta ends it.
        self.message: dict[str, Any] = {"id": new_message_id(), "type": "message", "role": "assistant", "model": codec.model}
        self.started_usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None

    # -- reading the upstream's events -------------------------------------------------
    def read(self, event: dict[str, Any]) -> str:
        """Take in one upstream event; the answer text it adds."""
        kind = event["type"]
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = {k: v for k, v in event["message"].items() if k not in ("content", "usage", "stop_reason", "stop_sequence")}
            usage = event["message"].get("usage")
            self.started_usage = dict(usage) if isinstance(usage, dict) else {}
        elif kind == "content_block_start":
            return self._started(event.get("index", 0), event.get("content_block") or {})
        elif kind == "content_block_delta":
            return self._delta(event.get("index", 0), event.get("delta") or {})
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            self.stop_reason, self.stop_sequence = delta.get("stop_reason"), delta.get("stop_sequence")
            # message_delta's counts are the message's so far; it leaves out what it does not update.
            counts = {**self.started_usage, **{k: v for k, v in (event.get("usage") or {}).items() if v is not None}}
            self.codec.usage(self.usage, {"usage": counts})
        return ""

    def _started(self, index: int, block: dict[str, Any]) -> str:
        """A block started: a tool call noted; its text, if it is a text block."""
        if block.get("type") == "tool_use":
            self.tool_calls[index] = function_call(str(block.get("id") or ""), str(block.get("name") or ""), "")
        return str(block.get("text") or "") if block.get("type") == "text" else ""

    def _delta(self, index: int, delta: dict[str, Any]) -> str:
        """A block's delta: its text, or a piece of a tool call's arguments."""
        if delta.get("type") == "text_delta":
            return str(delta.get("text") or "")
        if delta.get("type") == "input_json_delta" and index in self.tool_calls:
            self.tool_calls[index]["function"]["arguments"] += str(delta.get("partial_json") or "")
        return ""

    def calls(self) -> list[dict[str, Any]]:
        """The round's tool calls so far."""
        return list(self.tool_calls.values())

    # -- writing the client's ----------------------------------------------------------
    @property
    def first(self) -> int:
        """The index of the answer's first block: 1 after a compaction block."""
        return int(self.codec.compaction is not None)

    def opening(self) -> bytes:
        """``message_start`` with the answering call's usage (and the compaction block), then the answer's text block opened."""
        # The answering call's usage as its message_start told it (its message_delta is not read yet).
        started = {k: v for k, v in self.started_usage.items() if isinstance(v, int)}
        opened = message_start(self.message, {**usage_of(self.usage), **started}) + self._compaction()
        return opened if self.codec.paused else opened + block_start(self.first, {"type": "text", "text": ""})

    def _compaction(self) -> bytes:
        """The compaction block, whole, first in the message, where the request's history was compacted."""
        block = self.codec.compaction
        return b"" if block is None else block_start(0, block) + block_stop(0)

    def text(self, text: str) -> bytes:
        """A text delta of the answer's block (none when the answer is the compaction block alone)."""
        if self.codec.paused:  # the compaction block alone
            return b""
        return text_delta(self.first, text)

    failure = staticmethod(failure)

    def closing(self) -> Iterator[bytes]:
        """The answer's block stopped, then ``message_delta`` with the stop reason and usage, and ``message_stop``."""
        if not self.codec.paused:
            yield block_stop(self.first)
        delta = {"stop_reason": "compaction" if self.codec.paused else relayed_stop(self.stop_reason), "stop_sequence": self.stop_sequence}
        yield from message_end(delta, usage_of(self.usage), **self.codec.managed_fields())

    async def replay(self, events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """The round as the upstream sent it, its message_delta with the answering call's usage (and a compaction
        block first, where the history was compacted: the upstream's blocks after it)."""
        for event in events:
            if self.codec.paused and event["type"].startswith("content_block_"):
                continue
            if event["type"] == "message_delta":
                event = {**event, "usage": usage_of(self.usage), **self.codec.managed_fields()}
                if self.codec.paused:
                    event["delta"] = {**(event.get("delta") or {}), "stop_reason": "compaction"}
            elif self.first and event["type"].startswith("content_block_"):
                event = {**event, "index": int(event.get("index") or 0) + self.first}
            yield named_event(event["type"], event)
            if event["type"] == "message_start":
                yield self._compaction()


MESSAGES = Api("messages", "/messages", frozenset({"system", "model", "stream", "tools", "tool_choice"}), read, MessagesCodec, failure, as_stream=as_stream)
