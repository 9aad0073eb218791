"""An upstream's refusal of a prompt longer than its model's context window, and the window it names.

A model behind the proxy may have a smaller window than its name says: a
local server started with ``-c 24576`` serving a client that asks for
``claude-sonnet-4-5``, a provider's deployment with a shorter limit. The
upstream then refuses a request the proxy let through untouched. Its refusal
says so, each server in its words, most with the window:

* OpenAI and vLLM: ``This model's maximum context length is 128000 tokens…``,
  code ``context_length_exceeded`` (newer OpenAI models: no number);
* Anthropic: ``prompt is too long: 208310 tokens > 200000 maximum``;
* llama.cpp: type ``exceed_context_size_error``, with ``n_ctx``.

The proxy learns the window from it and pages the request instead
(``web.routes``), so that the client never sees the refusal and never
compacts its own history.
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["Refusal", "TooLong", "refused_window"]

# The error bodies the proxy reads are small; a longer body is not a refusal of this kind.
MOST_BYTES = 64 * 1024
_NAMED = (
    re.compile(r"maximum context length is (\d+)"),
    re.compile(r"prompt is too long: \d+ tokens > (\d+) maximum"),
    re.compile(r"context (?:window|length|size) (?:of|is) (\d+)"),
)
# The prompt's own size, as the upstream counted it: its tokenizer is not the proxy's.
_COUNTED = (re.compile(r"resulted in (\d+) tokens"), re.compile(r"prompt is too long: (\d+) tokens"), re.compile(r"requested (\d+) tokens"))
_UNNAMED = re.compile(r"context_length_exceeded|exceed_context_size|exceeds the context window|context length exceeded|prompt is too long", re.I)


class Refusal(msgspec.Struct, frozen=True):
    """A prompt refused as longer than the model's window: the window and the prompt as the upstream counted them (0: not named)."""

    window: int = 0
    counted: int = 0

    def in_our_count(self, ours: int) -> int:
        """The window in the proxy's count of tokens, for a prompt it counts ``ours``: named none, a tenth less than the prompt."""
        if not self.window:
            return ours - ours // 10
        return self.window * ours // self.counted if self.counted > self.window else self.window


class TooLong(Exception):
    """The upstream refused a request as longer than its model's window."""

    def __init__(self, refusal: Refusal):
        super().__init__(f"longer than the model's window ({refusal.window or 'unknown'})")
        self.refusal = refusal


def refused_window(content: bytes) -> Refusal | None:
    """What an upstream's refusal of a prompt longer than its window says; None: not such a refusal."""
    if len(content) > MOST_BYTES:
        return None
    text = content.decode("utf-8", "replace")
    if not _UNNAMED.search(text) and "maximum context length" not in text:
        return None
    try:
        body = msgspec.json.decode(content)
    except msgspec.DecodeError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("n_ctx"), int) and error["n_ctx"] > 0:  # llama.cpp's
        counted = error.get("n_prompt_tokens")
        return Refusal(int(error["n_ctx"]), counted if isinstance(counted, int) else 0)
    return Refusal(_number(_NAMED, text), _number(_COUNTED, text))


def _number(patterns: tuple[re.Pattern[str], ...], text: str) -> int:
    """The number the first of ``patterns`` that matches ``text`` finds, else 0."""
    found = next((m for m in (p.search(text) for p in patterns) if m), None)
    return int(found.group(1)) if found else 0
