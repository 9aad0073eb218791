"""Hybrid v3 mode (docs/spec/context-protocol-hybrid-v3.md): a computable state snapshot that rides every answer.

The rules only: the snapshot's shape and how a model's snapshot is read
(``snapshot``), where the answer ends and the snapshot begins (``separator``),
how the snapshot lives between rounds (``lifecycle``), and what the model is
told (``prompt``).
"""

from .lifecycle import Aging, RoundFacts, TodoItem, age, fit, held_payloads, rehydrate, render, system_snapshot, this_round
from .prompt import context_prompt, with_system_text
from .separator import SEPARATOR, SeparatorGate, split_answer
from .snapshot import TIERS, Block, Cursor, Limits, Memory, Reading, Runtime, Snapshot, Todo, Violation, check, parse_context, read_snapshot

__all__ = [
    "SEPARATOR",
    "TIERS",
    "Aging",
    "Block",
    "Cursor",
    "Limits",
    "Memory",
    "Reading",
    "RoundFacts",
    "Runtime",
    "SeparatorGate",
    "Snapshot",
    "Todo",
    "TodoItem",
    "Violation",
    "age",
    "check",
    "context_prompt",
    "fit",
    "held_payloads",
    "parse_context",
    "read_snapshot",
    "rehydrate",
    "render",
    "split_answer",
    "system_snapshot",
    "this_round",
    "with_system_text",
]
