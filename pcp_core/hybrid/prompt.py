"""What the model is given in Hybrid mode: the protocol's rules, and the snapshot it works from.

It goes into the system prompt of every upstream call, passthrough or
protocol mode, where the client's own system text is kept before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .separator import SEPARATOR
from .snapshot import Snapshot, render

__all__ = ["context_prompt", "with_system_text"]

RULES = f"""Context Protocol, Hybrid mode, version 3.0. contextMode = enabled.
End every response with a line holding only {SEPARATOR}, followed by the context snapshot as one JSON object, parseable by JSON.parse, with nothing after it: no markdown, no comments, no second {SEPARATOR}.
The snapshot is computable state, not narrative. Start from the snapshot below and change only what changed.
- version, runtime.*, todo.summary, todo.total and todo.step are the system's: copy them exactly.
- You may set todo.cursor: {{"v": 1, "phase": "planning|doing|verifying|blocked", "next": "none|todo_list|todo_add|todo_update|todo_complete|todo_reopen|todo_remove|todo_clear_done", "targetId": null for none, todo_list, todo_add and todo_clear_done, else a positive integer, "note": "optional"}}.
- Memory blocks go only in memory.core (stable facts, preferences, constraints), memory.working (this task), memory.ephemeral (short-lived) or memory.longterm (reusable knowledge).
- Every block has id, type, decay (0-1), confidence (0-1), round, tags and content. Update a block by its id rather than add a duplicate; omit blocks with high decay or low confidence; keep the best first in each tier.
- A block with content_state "tag_ref" is a placeholder for stored content; keep it as it is."""

DISABLED = "Context Protocol, Hybrid mode, version 3.0. contextMode = disabled: do not output a context section."


def context_prompt(snapshot: Snapshot | None) -> str:
    """The rules and the current snapshot (None: the mode is disabled for this request)."""
    if snapshot is None:
        return DISABLED
    return f"{RULES}\nCurrent context snapshot:\n{render(snapshot)}"


def with_system_text(messages: Sequence[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """``messages`` with ``text`` at the end of their leading system message (one is added before them if there is none)."""
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
