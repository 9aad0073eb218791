"""Where a model's answer ends and its context snapshot begins: ``<<<CONTEXT>>>``.

The client never sees the separator or what follows it, however the answer
is chunked: text flows until a ``<`` that could begin the separator, which is
held until it is known not to, and trailing white space is held until more
text follows it (an answer that ends before the separator ends clean).
"""

from __future__ import annotations

__all__ = ["SEPARATOR", "SeparatorGate", "split_answer"]

SEPARATOR = "<<<CONTEXT>>>"


def split_answer(text: str) -> tuple[str, str | None, int]:
    """The answer a client sees, what follows the separator (None without one), and how many separators there were."""
    gate = SeparatorGate()
    visible = gate.feed(text) + gate.flush()
    return visible, gate.context, gate.separators


class SeparatorGate:
    def __init__(self) -> None:
        self.held = ""  # visible text not released yet: a possible separator's start, or white space
        self.after: list[str] | None = None  # what followed the first separator
        self.separators = 0

    def feed(self, chunk: str) -> str:
        """Text the client may see now."""
        if self.after is not None:
            self.after.append(chunk)
            return ""
        text = self.held + chunk
        at = text.find(SEPARATOR)
        if at >= 0:
            self.after = [text[at + len(SEPARATOR) :]]
            self.separators = 1
            self.held = ""
            return text[:at].rstrip()
        keep = _undecided(text)
        self.held = text[keep:]
        return text[:keep]

    def flush(self) -> str:
        """The answer is complete: what was held back was not a separator (trailing space aside)."""
        if self.after is not None:
            return ""
        held, self.held = self.held, ""
        return held.rstrip()

    @property
    def context(self) -> str | None:
        """The snapshot's text: what follows the last separator, without surrounding space."""
        if self.after is None:
            return None
        rest = "".join(self.after)
        self.separators = 1 + rest.count(SEPARATOR)
        return rest.rsplit(SEPARATOR, 1)[-1].strip()


def _undecided(text: str) -> int:
    """Where the text that may not be released yet starts: a tail that could begin the separator
    (with the space before it), or trailing space."""
    for start in range(max(len(text) - len(SEPARATOR) + 1, 0), len(text)):
        if text[start] == "<" and SEPARATOR.startswith(text[start:]):
            return len(text[:start].rstrip())
    return len(text.rstrip())
