"""Hybrid mode's answers as they reach the client: the context section taken out, however they come.

An answer comes whole (a chat completion), as the events of a stream the
proxy reads (protocol mode), or as the bytes of a stream it relays
(passthrough). In each, every choice's text goes through a
``SeparatorGate``: the client gets what precedes ``<<<CONTEXT>>>``, and
choice 0's section is noted for the session (``Sections.noted``). Text a gate
held back at the end of a choice (a ``<`` that was not a separator after all)
is released with that choice's finish, or in an event of its own before the
stream ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from pcp_core.hybrid import SeparatorGate, split_answer

__all__ = ["Sections"]

# What a round's choice 0 wrote after the separator (None: no separator), how many separators, and whether it called tools.
Note = Callable[[str | None, int, bool], None]


class Sections:
    """The gates of one upstream answer, by choice index."""

    def __init__(self, note: Note):
        """A stream's sections cut as they come; ``note`` gets what they held."""
        self.note = note
        self.gates: dict[int, SeparatorGate] = {}
        self.meta: dict[str, Any] = {}  # the last event's id, model, created: for an event of the proxy's own
        self.ended = False
        self.tool_calls = False  # choice 0 called tools

    def completion(self, data: Any) -> None:
        """A whole chat completion, each choice's text cut at the separator (in place)."""
        for choice in _choices(data):
            message = choice.get("message")
            if not isinstance(message, dict):
                continue
            context, separators = None, 0
            if isinstance(message.get("content"), str):
                message["content"], context, separators = split_answer(message["content"])
            if choice.get("index", 0) == 0:
                self.note(context, separators, bool(message.get("tool_calls")))

    def event(self, event: Any) -> bool:
        """One chunk of a stream, cut in place; whether it changed."""
        changed = False
        self.meta = {k: event[k] for k in ("id", "object", "created", "model") if k in event} if isinstance(event, dict) else self.meta
        for choice in _choices(event):
            gate = self.gates.setdefault(choice.get("index", 0), SeparatorGate())
            delta = choice.get("delta")
            self.tool_calls = self.tool_calls or choice.get("index", 0) == 0 and isinstance(delta, dict) and bool(delta.get("tool_calls"))
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                text = delta["content"]
                delta["content"] = gate.feed(text)
                changed = changed or delta["content"] != text  # most events go through as they came
            if choice.get("finish_reason"):
                held = gate.flush()
                if held and isinstance(delta, dict):
                    delta["content"] = (delta.get("content") or "") + held
                    changed = True
        return changed

    def ending(self) -> dict[str, Any] | None:
        """The stream is over: an event with what the gates still hold (None if nothing), and choice 0's section noted (once)."""
        if self.ended:
            return None
        self.ended = True
        held = [{"index": i, "delta": {"content": text}, "finish_reason": None} for i, gate in sorted(self.gates.items()) if (text := gate.flush())]
        gate = self.gates.get(0)
        self.note(gate.context if gate is not None else None, gate.separators if gate is not None else 0, self.tool_calls)
        return {**self.meta, "choices": held} if held else None

    async def events(self, source: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """A stream's chunks as the proxy reads them (protocol mode), cut."""
        async for event in source:
            self.event(event)
            yield event
        last = self.ending()
        if last is not None:
            yield last

    async def sse(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """A stream's bytes as the proxy relays them (passthrough), cut; events it need not change go as they came."""
        pending = b""
        async for chunk in chunks:
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            out = b"".join(self._line(line) + b"\n" for line in lines)
            if out:
                yield out
        if pending:
            yield self._line(pending)
        last = self.ending()
        if last is not None:  # a stream cut short of [DONE] still gets what was held back
            yield _data(last)

    def _line(self, line: bytes) -> bytes:
        """One line of the stream, its choices' text with the model's context section cut out."""
        crlf = line.endswith(b"\r")
        data = line.rstrip(b"\r")
        if not data.startswith(b"data:"):
            return line
        payload = data[5:].strip()
        if payload == b"[DONE]":
            last = self.ending()  # [DONE] is the end, whatever follows it
            return (_data(last) if last is not None else b"") + line
        try:
            event = msgspec.json.decode(payload)
        except (msgspec.DecodeError, RecursionError):
            return line  # not a chunk the proxy can read: as it came
        if not self.event(event):
            return line
        return b"data: " + msgspec.json.encode(event) + (b"\r" if crlf else b"")


def _choices(data: Any) -> list[dict[str, Any]]:
    """The choices of a chat-completion chunk, those that are objects."""
    choices = data.get("choices") if isinstance(data, dict) else None
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def _data(event: dict[str, Any]) -> bytes:
    """An event as a server-sent ``data:`` line."""
    return b"data: " + msgspec.json.encode(event) + b"\n\n"
