"""One streamed worker call, of any API, read through an ``AnswerGate``.

Any round may turn out to be the answer. The round is read until it commits
to answering (``until_committed``): then the client's stream starts, and the
rest of the round is relayed as it is generated (``rest``). A round that ends
in directives is never seen by the client. What is read of the upstream's
events and written to the client is the API's (``codec.RoundStream``); what
is held back and when is the same for every API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pcp_core import AnswerGate, CallWorker, WorkerReply, calls_client_tool

if TYPE_CHECKING:
    from ..apis.codec import RoundStream

__all__ = ["StreamedRound"]

OpenStream = Callable[[], Awaitable[AsyncIterator[dict[str, Any]]]]


class StreamedRound:
    def __init__(self, call: CallWorker, open_stream: OpenStream, api: RoundStream):
        self.call = call
        self.open_stream = open_stream
        self.api = api
        self.gate = AnswerGate(final=call.final)
        self.events: list[dict[str, Any]] = []
        self.ended = False  # the upstream's stream is over
        self._iterator: AsyncIterator[str] = self._texts()

    async def _texts(self) -> AsyncIterator[str]:
        """Releasable text as the upstream generates it; ends when the round does."""
        async for event in await self.open_stream():
            self.events.append(event)
            text = self.api.read(event)
            if text:
                yield self.gate.feed(text)
        self.ended = True
        yield self.gate.close()

    async def until_committed(self) -> str | None:
        """The first text released, once the round commits to answering; None if it never does.

        A round that calls tools and has written no text by its end is not an answer:
        its calls are directives, or the client's own (``client_tool_calls``).
        """
        async for text in self._iterator:
            if self.gate.committed and (text or self.call.final):
                return None if self.ended and self.api.calls() else text
        return None

    async def rest(self) -> AsyncIterator[str]:
        """The rest of the round's text, as it comes."""
        async for text in self._iterator:
            if text:
                yield text

    def client_tool_calls(self, client_tools: list[dict[str, Any]]) -> bool:
        """Whether the round calls one of the client's own tools."""
        return calls_client_tool(self.api.calls(), client_tools)

    def reply(self, delivered: bool) -> WorkerReply:
        """The round as the rules read it; ``delivered``: the client has it already."""
        return WorkerReply(text=self.gate.raw_text, tool_calls=self.api.calls(), delivered=delivered)
