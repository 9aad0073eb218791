"""What of a worker's reply reaches the client, and when.

Any round may turn out to be the answer, and a streaming client should see it
as it is generated — but never a directive. So a round's text is held until it
is clearly an answer: enough prose has arrived with no directive before it
(``commit_chars``), or the reply ended without one. From then on text flows
through at once, and directives that show up late are dropped. In the final
round nothing is held: directives are not accepted there anyway.

Nor does the prompt itself reach the client, should the model echo it: the
document's tags are markup, and the registry's sentences are taken out as the
text flows (``scaffolding``); held back text counts toward the commitment only
once it is known not to be one of them.

An answer that says nothing once its directives are taken out says so
(``NO_ANSWER``): a client never gets an empty answer for a question.
"""

from __future__ import annotations

from ..prompt.markup import Unescaping
from ..prompt.scaffolding import Scaffolding
from .parser import DirectiveParser, parse_directives
from .vocabulary import Markup, Text

__all__ = ["NO_ANSWER", "AnswerGate", "spoken"]

COMMIT_CHARS = 80
NO_ANSWER = "I could not find that in our conversation."


def spoken(text: str) -> str:
    """What a whole reply says to the client: its text without directives or markup, or ``NO_ANSWER``."""
    return parse_directives(text)[0].strip() or NO_ANSWER


class AnswerGate:
    def __init__(self, final: bool, commit_chars: int = COMMIT_CHARS):
        self.parser = DirectiveParser()
        self.scaffolding = Scaffolding()
        self.committed = final
        self.commit_chars = commit_chars
        self.saw_directive = False
        self.spoke = False  # some text that is not blank was released
        self.held: list[str] = []
        self.raw: list[str] = []  # the reply as the worker wrote it, directives included
        self.unescaping = Unescaping()  # the document's escaping, undone before anything is read

    def feed(self, chunk: str) -> str:
        """Text that may be released to the client now."""
        self.raw.append(chunk)
        return self._take(self.parser.feed(self.unescaping.feed(chunk)), end=False)

    def close(self) -> str:
        """The reply is complete: release what a directive-free reply held back (``NO_ANSWER`` if it held no answer)."""
        out = self._take(self.parser.feed(self.unescaping.flush()) + self.parser.flush(), end=True)
        return out if self.spoke or not self.committed else out + NO_ANSWER

    def _take(self, events: list, end: bool) -> str:
        """The text of ``events`` that reaches the client now: held back until the reply shows it is an answer, not directives."""
        out: list[str] = []
        texts = [self.scaffolding.feed(event.text) if isinstance(event, Text) else event for event in events]
        if end:
            texts.append(self.scaffolding.flush())
        for event in texts:
            if isinstance(event, str):
                (out if self.committed else self.held).append(event)
            elif not self.committed and not isinstance(event, Markup):  # a directive, or a malformed one, before any commitment
                self.saw_directive = True
        if not self.committed and not self.saw_directive:
            held = "".join(self.held)
            if end or len(held.strip()) >= self.commit_chars:
                self.committed = True
                out.insert(0, held.lstrip())
                self.held = []
        released = "".join(out)
        self.spoke = self.spoke or bool(released.strip())
        return released

    @property
    def raw_text(self) -> str:
        """The reply as the model wrote it so far, directives and all."""
        return "".join(self.raw)
