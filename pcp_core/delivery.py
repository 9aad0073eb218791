"""Which part of a streamed worker reply may reach the client, and when.

Any round may turn out to be the answer, and a streaming client should see it
as it is generated — but never a directive. So a round's text is held until it
is clearly an answer: enough prose has arrived with no directive before it
(``commit_chars``), or the reply ended without one. From then on text flows
through at once, and directives that show up late are dropped. In the final
round nothing is held: directives are not accepted there anyway.
"""

from __future__ import annotations

from .directives import DirectiveParser, Markup, Text

__all__ = ["AnswerGate"]

COMMIT_CHARS = 80


class AnswerGate:
    def __init__(self, final: bool, commit_chars: int = COMMIT_CHARS):
        self.parser = DirectiveParser()
        self.committed = final
        self.commit_chars = commit_chars
        self.saw_directive = False
        self.held: list[str] = []
        self.raw: list[str] = []  # the reply as the worker wrote it, directives included

    def feed(self, chunk: str) -> str:
        """Text that may be released to the client now."""
        self.raw.append(chunk)
        return self._take(self.parser.feed(chunk), end=False)

    def close(self) -> str:
        """The reply is complete: release what a directive-free reply held back."""
        return self._take(self.parser.flush(), end=True)

    def _take(self, events: list, end: bool) -> str:
        out: list[str] = []
        for event in events:
            if isinstance(event, Text):
                (out if self.committed else self.held).append(event.text)
            elif not self.committed and not isinstance(event, Markup):  # a directive, or a malformed one, before any commitment
                self.saw_directive = True
        if not self.committed and not self.saw_directive:
            held = "".join(self.held)
            if end or len(held.strip()) >= self.commit_chars:
                self.committed = True
                out.insert(0, held.lstrip())
                self.held = []
        return "".join(out)

    @property
    def raw_text(self) -> str:
        return "".join(self.raw)
