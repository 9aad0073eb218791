"""One streamed worker call of the chat API, read through an ``AnswerGate``.

Any round may turn out to be the answer. The round is read until it commits
to answering (``until_committed``): then the client's stream starts, and the
rest of the round is relayed as it is generated (``rest``). A round that ends
in directives is never seen by the client.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import msgspec

from pcp_core import AnswerGate, CallWorker, WorkerReply, calls_client_tool, short_hash

from .chat import DONE, Usage, sse_event

__all__ = ["StreamedRound"]

OpenStream = Callable[[], Awaitable[AsyncIterator[dict[str, Any]]]]


class StreamedRound:
    def __init__(self, call: CallWorker, open_stream: OpenStream, usage: Usage, model: str):
        self.call = call
        self.open_stream = open_stream
        self.usage = usage
        self.gate = AnswerGate(final=call.final)
        self.events: list[dict[str, Any]] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.ended = False  # the upstream's stream is over
        self.finish_reason: str | None = None  # why the upstream says the round ended
        self.meta = {"id": f"chatcmpl-pcp{short_hash(str(time.time_ns()))}", "model": model, "created": int(time.time())}
        self._iterator: AsyncIterator[str] = self._texts()

    async def _texts(self) -> AsyncIterator[str]:
        """Releasable text as the upstream generates it; ends when the round does."""
        async for event in await self.open_stream():
            self.events.append(event)
            self.usage.add(event.get("usage"))
            self.meta.update({k: event[k] for k in ("id", "model", "created") if k in event})
            for choice in event.get("choices") or ():
                self.finish_reason = choice.get("finish_reason") or self.finish_reason
                delta = choice.get("delta") or {}
                self._collect_tool_calls(delta.get("tool_calls") or ())
                if delta.get("content"):
                    yield self.gate.feed(delta["content"])
        self.ended = True
        yield self.gate.close()

    async def until_committed(self) -> str | None:
        """The first text released, once the round commits to answering; None if it never does.

        A round that calls tools and has said nothing by its end is not an answer:
        its calls are directives, or the client's own (``client_tool_calls``).
        """
        async for text in self._iterator:
            if self.gate.committed and (text or self.call.final):
                return None if self.ended and self.tool_calls else text
        return None

    async def rest(self) -> AsyncIterator[str]:
        async for text in self._iterator:
            if text:
                yield text

    def _collect_tool_calls(self, deltas: Any) -> None:
        for delta in deltas:
            call = self.tool_calls.setdefault(delta.get("index", 0), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] = delta.get("id") or call["id"]
            function = delta.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""

    def client_tool_calls(self, client_tools: list[dict[str, Any]]) -> bool:
        return calls_client_tool(list(self.tool_calls.values()), client_tools)

    def reply(self, delivered: bool) -> WorkerReply:
        return WorkerReply(text=self.gate.raw_text, tool_calls=list(self.tool_calls.values()), delivered=delivered)

    async def replay(self, include_usage: bool) -> AsyncIterator[bytes]:
        """The round as the upstream sent it, but for the usage the proxy asked it for (``ending`` tells the sum)."""
        for event in self.events:
            if event.get("choices") or not event.get("usage"):
                yield self.event({k: v for k, v in event.items() if k != "usage"})
        for event in self.ending(include_usage):
            yield event

    def ending(self, include_usage: bool) -> Iterator[bytes]:
        """What follows an answer's last chunk: the usage of every upstream call, when the client asked for it; [DONE]."""
        if include_usage:
            yield self.event({"choices": [], "usage": msgspec.to_builtins(self.usage)})
        yield DONE

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return self.event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

    def event(self, payload: dict[str, Any]) -> bytes:
        return sse_event({**self.meta, "object": "chat.completion.chunk", **payload})
