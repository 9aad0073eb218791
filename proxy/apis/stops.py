"""Stop sequences the proxy watches for itself: which one fired is then known, whatever the upstream reports.

A chat upstream told ``stop`` ends its text before the sequence and says only
``finish_reason: "stop"`` — the same as at its end of turn — so a Messages
client could not learn which of its ``stop_sequences`` fired (vLLM names it in
``stop_reason``, llama.cpp's and OpenAI's chat completions do not). The
translation therefore does not send them upstream: it reads the answer as a
stream, releases its text with any tail that may begin a sequence held back,
and at the first sequence complete cuts the text there and closes the upstream's
stream, which ends the generation.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Stops"]


class Stops:
    """The text of one answer, fed as it comes: what may be released, and the sequence that fired (``fired``)."""

    def __init__(self, sequences: Iterable[str]):
        self.sequences = [s for s in sequences if s]
        self.held = ""
        self.fired: str | None = None

    def feed(self, text: str) -> str:
        """The text that may be released now: all of it less a tail that may begin a sequence, or what comes
        before the sequence that completed first (nothing after it)."""
        if self.fired is not None:
            return ""
        text = self.held + text
        self.held = ""
        ends = [(text.find(s) + len(s), -len(s), s) for s in self.sequences if s in text]
        if ends:
            _, _, self.fired = min(ends)
            return text[: text.find(self.fired)]
        keep = max((k for s in self.sequences for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])), default=0)
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """What was held back, once the answer has ended without a sequence."""
        held, self.held = self.held, ""
        return held
