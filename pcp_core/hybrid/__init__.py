"""Hybrid v3 mode (docs/spec/context-protocol-hybrid-v3.md): a computable state snapshot that rides every answer.

The rules only: the snapshot's shape and how a model's snapshot is read
(``snapshot``), where the answer ends and the snapshot begins (``separator``),
how the snapshot lives between rounds (``lifecycle``, ``cold``), which session a request
continues when it names none (``continuity``), and what the model is given
(``prompt``).
"""

from .cold import Cold, Shelved, fit, kept_cold, rehydrate
from .continuity import continued_links, normal_workspace
from .lifecycle import AgingPolicy, RoundFacts, TodoItem, age, scope_core, system_snapshot, this_round, todo_projection, within_room
from .prompt import context_prompt, with_system_text
from .separator import SEPARATOR, SeparatorGate, split_answer
from .snapshot import (
    TIERS,
    Block,
    Cursor,
    LimitsPolicy,
    Memory,
    Reading,
    Runtime,
    Snapshot,
    Todo,
    Violation,
    block_problems,
    check,
    parse_context,
    read_snapshot,
    render,
)

__all__ = [
    "SEPARATOR",
    "TIERS",
    "AgingPolicy",
    "Block",
    "Cold",
    "Cursor",
    "LimitsPolicy",
    "Memory",
    "Reading",
    "RoundFacts",
    "Runtime",
    "SeparatorGate",
    "Shelved",
    "Snapshot",
    "Todo",
    "TodoItem",
    "Violation",
    "age",
    "block_problems",
    "check",
    "context_prompt",
    "continued_links",
    "fit",
    "kept_cold",
    "normal_workspace",
    "parse_context",
    "read_snapshot",
    "rehydrate",
    "scope_core",
    "render",
    "split_answer",
    "system_snapshot",
    "this_round",
    "todo_projection",
    "within_room",
    "with_system_text",
]
