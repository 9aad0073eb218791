"""Anthropic's context management (``context_management.edits``), by its rules: what each edit clears, and what it reports.

A Messages request may ask the provider to edit its context before the model
reads it. Where the upstream does not (it speaks chat completions only), the
proxy applies the edits itself, and loses nothing: what an edit clears is paged
in the request's session, which the model can Consult. This module only decides;
the host pages and answers.

* ``clear_tool_uses_20250919``: over its ``trigger`` (input tokens, default
  100,000; or a number of tool uses), every tool use but the ``keep`` most recent
  (default 3) and those of ``exclude_tools`` has its result replaced by a
  placeholder (and its input emptied, with ``clear_tool_inputs``: all of them, or
  those of the tools it names); not applied when that clears fewer tokens than
  ``clear_at_least``.
* ``clear_thinking_20251015``: thinking blocks of all but the ``keep`` most
  recent assistant turns that have them (default 1; ``"all"`` keeps every one).
* ``compact_20260112``: over its ``trigger`` (default 150,000 input tokens), the
  history before the answer is handed back as one ``compaction`` block.

Each edit that clears something is reported as Anthropic reports it, in
``applied_edits``: its ``type``, what it cleared (``cleared_tool_uses`` or
``cleared_thinking_turns``) and ``cleared_input_tokens``.

A compaction block a client sends back stands for everything before it
(``after_compaction``): the messages before it are dropped, and what the block
holds (the proxy's handle to the pages) is the host's to open.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from .pages.logical import Origin, Page
from .paging.history import PagedHistory
from .text.tokens import CountText

__all__ = [
    "CLEARED",
    "COMPACT",
    "CLEAR_THINKING",
    "CLEAR_TOOL_USES",
    "Compaction",
    "EditError",
    "Edited",
    "after_compaction",
    "apply_edits",
    "edits_of",
    "stored_pages",
]

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
KNOWN = (CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT)
CLEARED = "[This tool result was cleared from the context. It is kept as a page of this conversation: Consult it to read it again.]"
THINKING = ("thinking", "redacted_thinking")
DEFAULT_TOOL_TRIGGER = 100_000
DEFAULT_KEEP = 3
DEFAULT_COMPACT_TRIGGER = 150_000

Message = dict[str, Any]


class EditError(ValueError):
    """An edit the request asks for that cannot be read: ``param`` says where."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class Compaction(msgspec.Struct, frozen=True):
    """A ``compact_20260112`` edit that fired: the history is handed back as one block."""

    pause_after_compaction: bool = False
    instructions: str | None = None


class Edited(msgspec.Struct, frozen=True):
    """The request's messages as its edits leave them, and what they report."""

    messages: list[Message]
    applied: list[dict[str, Any]] = []  # ``context_management.applied_edits``, in the order the edits were asked
    cleared_tokens: int = 0  # input tokens the clearing edits removed
    compaction: Compaction | None = None

    @property
    def clears(self) -> bool:
        """Whether a clearing edit applied (tool uses or thinking)."""
        return bool(self.applied)


def edits_of(context_management: Any) -> list[dict[str, Any]]:
    """The edits a request's ``context_management`` asks for, each checked (an unknown type is an error, as it is Anthropic's)."""
    if context_management is None:
        return []
    if not isinstance(context_management, dict):
        raise EditError("context_management is not an object", "context_management")
    edits = context_management.get("edits") or []
    if not isinstance(edits, list):
        raise EditError("context_management.edits is not a list", "context_management.edits")
    for i, edit in enumerate(edits):
        where = f"context_management.edits.[{i}]"
        if not isinstance(edit, dict) or edit.get("type") not in KNOWN:
            raise EditError(f"{where} is not an edit the proxy knows ({', '.join(KNOWN)})", f"{where}.type")
        for field in ("trigger", "keep", "clear_at_least"):
            if field in edit and edit[field] is not None and not (edit[field] == "all" or _threshold(edit[field]) is not None):
                raise EditError(f"{where}.{field} is not {{type, value}} with a whole number value", f"{where}.{field}")
    return edits


def apply_edits(messages: Sequence[Message], edits: Sequence[dict[str, Any]], input_tokens: int, count: CountText) -> Edited:
    """``messages`` (Anthropic's) with ``edits`` applied in order, for a prompt of ``input_tokens``."""
    edited = Edited(list(messages))
    for edit in edits:
        kind = edit["type"]
        if kind == CLEAR_TOOL_USES:
            edited = _clear_tool_uses(edited, edit, input_tokens, count)
        elif kind == CLEAR_THINKING:
            edited = _clear_thinking(edited, edit, count)
        elif kind == COMPACT and edited.compaction is None:
            trigger = _threshold(edit.get("trigger")) or ("input_tokens", DEFAULT_COMPACT_TRIGGER)
            if input_tokens > trigger[1]:
                instructions = edit.get("instructions")
                compaction = Compaction(bool(edit.get("pause_after_compaction")), instructions if isinstance(instructions, str) else None)
                edited = msgspec.structs.replace(edited, compaction=compaction)
    return edited


def _threshold(value: Any) -> tuple[str, int] | None:
    """A ``{type, value}`` threshold; None for anything else."""
    if isinstance(value, dict) and isinstance(value.get("value"), int) and not isinstance(value.get("value"), bool) and value["value"] >= 0:
        return str(value.get("type") or "input_tokens"), value["value"]
    return None


def _blocks(message: Message) -> list[Any]:
    """A message's content blocks (none for text content)."""
    content = message.get("content")
    return content if isinstance(content, list) else []


def _clear_tool_uses(edited: Edited, edit: dict[str, Any], input_tokens: int, count: CountText) -> Edited:
    """``edited`` with the older tool results cleared, as ``clear_tool_uses`` asks, once over its trigger."""
    messages = edited.messages
    uses = [
        (i, j, block)
        for i, message in enumerate(messages)
        if message.get("role") == "assistant"
        for j, block in enumerate(_blocks(message))
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    kind, value = _threshold(edit.get("trigger")) or ("input_tokens", DEFAULT_TOOL_TRIGGER)
    if (len(uses) if kind == "tool_uses" else input_tokens) <= value:
        return edited
    excluded = set(edit.get("exclude_tools") or ())
    keep = (_threshold(edit.get("keep")) or ("tool_uses", DEFAULT_KEEP))[1]
    clearable = [use for use in uses if use[2].get("name") not in excluded]
    cleared_ids = {str(block.get("id")) for _, _, block in clearable[: max(0, len(clearable) - keep)]}
    inputs = edit.get("clear_tool_inputs")
    clears_input = (lambda name: True) if inputs is True else (lambda name: name in inputs) if isinstance(inputs, list) else (lambda name: False)
    tokens, out, cleared = 0, [], 0
    results = {
        str(block.get("tool_use_id")) for message in messages for block in _blocks(message) if isinstance(block, dict) and block.get("type") == "tool_result"
    }
    for message in messages:
        blocks = _blocks(message)
        if not any(isinstance(b, dict) and (b.get("id") in cleared_ids or b.get("tool_use_id") in cleared_ids) for b in blocks):
            out.append(message)
            continue
        changed = []
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id") in cleared_ids and block.get("content") != CLEARED:
                tokens += count(_text(block.get("content")))
                block = {**{k: v for k, v in block.items() if k not in ("content", "is_error")}, "content": CLEARED}
            elif isinstance(block, dict) and block.get("type") == "tool_use" and block.get("id") in cleared_ids:
                cleared += block.get("id") in results
                if clears_input(block.get("name")) and block.get("input"):
                    tokens += count(json.dumps(block.get("input")))
                    block = {**block, "input": {}}
            changed.append(block)
        out.append({**message, "content": changed})
    at_least = _threshold(edit.get("clear_at_least"))
    if not cleared or (at_least is not None and tokens < at_least[1]):
        return edited
    applied = {"type": CLEAR_TOOL_USES, "cleared_tool_uses": cleared, "cleared_input_tokens": tokens}
    return msgspec.structs.replace(edited, messages=out, applied=[*edited.applied, applied], cleared_tokens=edited.cleared_tokens + tokens)


def _clear_thinking(edited: Edited, edit: dict[str, Any], count: CountText) -> Edited:
    """``edited`` with the thinking blocks of earlier turns cleared, but those ``keep`` says to keep."""
    keep = edit.get("keep")
    if keep == "all":
        return edited
    kept = (_threshold(keep) or ("thinking_turns", 1))[1]
    turns = [
        i
        for i, message in enumerate(edited.messages)
        if message.get("role") == "assistant" and any(isinstance(b, dict) and b.get("type") in THINKING for b in _blocks(message))
    ]
    cleared = set(turns[: max(0, len(turns) - kept)])
    if not cleared:
        return edited
    tokens = 0
    out = []
    for i, message in enumerate(edited.messages):
        if i in cleared:
            blocks = _blocks(message)
            tokens += sum(count(str(b.get("thinking") or b.get("data") or "")) for b in blocks if isinstance(b, dict) and b.get("type") in THINKING)
            message = {**message, "content": [b for b in blocks if not (isinstance(b, dict) and b.get("type") in THINKING)]}
        out.append(message)
    applied = {"type": CLEAR_THINKING, "cleared_thinking_turns": len(cleared), "cleared_input_tokens": tokens}
    return msgspec.structs.replace(edited, messages=out, applied=[*edited.applied, applied], cleared_tokens=edited.cleared_tokens + tokens)


def _text(content: Any) -> str:
    """The text of a block's content: a string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text") or "") if isinstance(b, dict) and b.get("type") == "text" else json.dumps(b) for b in content)
    return "" if content is None else json.dumps(content)


def after_compaction(messages: Sequence[Message]) -> tuple[str | None, list[Message]]:
    """What the last ``compaction`` block of ``messages`` holds (its ``encrypted_content``, else its ``content``), and the
    messages after it: those before it are dropped, as Anthropic drops them, and what its own message says after it stays.
    (None, the messages as they are) where there is none."""
    for i in range(len(messages) - 1, -1, -1):
        blocks = _blocks(messages[i])
        at = next((j for j in range(len(blocks) - 1, -1, -1) if isinstance(blocks[j], dict) and blocks[j].get("type") == "compaction"), None)
        if at is None:
            continue
        block = blocks[at]
        held = block.get("encrypted_content") or block.get("content")
        rest = [b for b in blocks[at + 1 :] if not (isinstance(b, dict) and b.get("type") == "compaction")]
        after = [{**messages[i], "content": rest}] if rest else []
        return (held if isinstance(held, str) else None), [*after, *messages[i + 1 :]]
    return None, list(messages)


def stored_pages(history: PagedHistory) -> list[Page]:
    """Every page of ``history`` (children before their containers), as pages from storage: the pages a compaction
    stands for, read beside a later request's own history (``request.rounds`` ranks them with it)."""
    return [msgspec.structs.replace(page, origin=Origin.STORAGE) for page in history.index().pages.values()]
