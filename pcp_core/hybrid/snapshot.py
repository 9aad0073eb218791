"""The Hybrid v3 snapshot: its shape, and how a model's snapshot is read against the previous one.

The model ends its answer with ``<<<CONTEXT>>>`` and a JSON snapshot of its
working state (spec: docs/spec/context-protocol-hybrid-v3.md). Some of it is
the system's (``version``, ``runtime``, the todo projection): whatever the
model wrote there, the system's values stand. The rest, the memory blocks and
the todo cursor, the model may write; a block that breaks a rule is dropped,
a cursor that breaks its shape is not taken, and every violation is named.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

__all__ = ["TIERS", "Block", "Cursor", "Limits", "Memory", "Reading", "Runtime", "Snapshot", "Todo", "read_snapshot"]

TIERS = ("core", "working", "ephemeral", "longterm")
REQUIRED = ("id", "type", "decay", "confidence", "round", "tags", "content")
Phase = Literal["planning", "doing", "verifying", "blocked"]
Next = Literal["none", "todo_list", "todo_add", "todo_update", "todo_complete", "todo_reopen", "todo_remove", "todo_clear_done"]
# The cursor's ``next`` values that name no item, and so take ``targetId: null``.
UNTARGETED = frozenset({"none", "todo_list", "todo_add", "todo_clear_done"})


class Block(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    type: str
    decay: float
    confidence: float
    round: int
    tags: tuple[str, ...]
    content: str
    # A cold placeholder: its payload is kept by the system under ``tag_id`` (spec: tag-based cold memory).
    content_state: Literal["active", "tag_ref"] = "active"
    tag_id: str | None = None
    tag_summary: str | None = None
    rehydrated_at: str | None = None

    @property
    def quality(self) -> float:
        """Higher is better: confident, and not decayed."""
        return self.confidence * (1.0 - self.decay)


class Memory(msgspec.Struct, frozen=True, kw_only=True):
    core: tuple[Block, ...] = ()
    working: tuple[Block, ...] = ()
    ephemeral: tuple[Block, ...] = ()
    longterm: tuple[Block, ...] = ()

    def tier(self, name: str) -> tuple[Block, ...]:
        return getattr(self, name)  # type: ignore[no-any-return]

    def blocks(self) -> Iterable[tuple[str, Block]]:
        return ((tier, block) for tier in TIERS for block in self.tier(tier))


class Cursor(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    v: Literal[1]
    phase: Phase
    next: Next
    targetId: int | None  # noqa: N815 - the spec's own name
    note: str | None = None


class Runtime(msgspec.Struct, frozen=True, kw_only=True):
    round: int
    workspace: str
    datetime: str
    startup_at: int


class Todo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    summary: str
    total: int
    step: int
    cursor: Cursor | None = None


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    version: float = 3.0
    runtime: Runtime
    memory: Memory = Memory()
    todo: Todo
    capabilities: tuple[dict[str, Any], ...] = ()
    active_task: str | None = None


class Limits(msgspec.Struct, frozen=True):
    """What a block must meet to be kept (rule 14: low-quality blocks are omitted)."""

    max_decay: float = 0.9
    min_confidence: float = 0.2


class Reading(msgspec.Struct, frozen=True):
    """A model's snapshot as the system takes it, and what in it broke the rules."""

    snapshot: Snapshot
    violations: tuple[str, ...] = ()


def read_snapshot(raw: Any, previous: Snapshot, system: Snapshot, limits: Limits = Limits()) -> Reading:
    """The snapshot the session keeps after a model wrote ``raw`` (decoded JSON).

    ``system`` carries the fields the system owns (version, runtime, the todo
    projection), which win over the model's; ``previous`` is the snapshot the
    model was shown. Memory blocks are merged into the previous ones by ``id``:
    a block the model rewrote replaces its old self, one it left out stays
    (the model may write only what changed). Not an object: the previous
    snapshot stands, with the system's fields.
    """
    kept = msgspec.structs.replace(previous, version=system.version, runtime=system.runtime, todo=_todo(previous.todo, system.todo))
    if not isinstance(raw, dict):
        return Reading(kept, ("the context is not a JSON object",))
    violations = _system_fields_changed(raw, system)
    memory, dropped = _memory(raw.get("memory"), previous.memory, limits)
    cursor, wrong = _cursor((raw.get("todo") or {}).get("cursor") if isinstance(raw.get("todo"), dict) else None)
    todo = msgspec.structs.replace(kept.todo, cursor=cursor) if cursor is not None else kept.todo
    task = raw.get("active_task")
    snapshot = msgspec.structs.replace(kept, memory=memory, todo=todo, active_task=task if isinstance(task, str) else kept.active_task, capabilities=_capabilities(raw, kept))
    return Reading(snapshot, (*violations, *dropped, *wrong))


def _todo(previous: Todo, system: Todo) -> Todo:
    return msgspec.structs.replace(system, cursor=previous.cursor if system.cursor is None else system.cursor)


def _system_fields_changed(raw: dict[str, Any], system: Snapshot) -> list[str]:
    """Rule 8: the system's fields, as the model wrote them, where they differ (they are restored)."""
    owned = msgspec.to_builtins(system)
    changed = [] if raw.get("version", owned["version"]) == owned["version"] else ["version"]
    for part, fields in (("runtime", ("round", "workspace", "datetime", "startup_at")), ("todo", ("summary", "total", "step"))):
        written = raw.get(part)
        if isinstance(written, dict):
            changed += [f"{part}.{f}" for f in fields if f in written and written[f] != owned[part][f]]
    return [f"{field} is the system's: restored" for field in changed]


def _memory(raw: Any, previous: Memory, limits: Limits) -> tuple[Memory, list[str]]:
    if raw is None:
        return previous, []
    if not isinstance(raw, dict):
        return previous, ["memory is not an object: the previous memory stands"]
    problems = [f"memory.{name} is not a tier (rule 10): dropped" for name in raw if name not in TIERS]
    tiers: dict[str, list[Block]] = {tier: list(previous.tier(tier)) for tier in TIERS}
    for tier in TIERS:
        written = raw.get(tier, [])
        if not isinstance(written, list):
            problems.append(f"memory.{tier} is not a list: dropped")
            continue
        for i, item in enumerate(written):
            block, problem = _block(item, limits)
            if problem:
                problems.append(f"memory.{tier}[{i}]: {problem}")
            if block is not None:
                _merge(tiers, tier, block)
    return Memory(**{tier: tuple(sorted(blocks, key=lambda b: -b.quality)) for tier, blocks in tiers.items()}), problems


def _block(item: Any, limits: Limits) -> tuple[Block | None, str]:
    """The block ``item`` is, or None and why it is dropped (rules 11–14)."""
    if not isinstance(item, dict):
        return None, "not an object: dropped"
    missing = [f for f in REQUIRED if f not in item]
    if missing:
        return None, f"missing {', '.join(missing)} (rule 11): dropped"
    try:
        block = msgspec.convert(item, Block)
    except msgspec.ValidationError as exc:
        return None, f"{exc}: dropped"
    for name in ("decay", "confidence"):
        value = getattr(block, name)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            return None, f"{name} {value} is outside [0, 1] (rules 12-13): dropped"
    if block.decay > limits.max_decay or block.confidence < limits.min_confidence:
        return None, f"low quality (decay {block.decay}, confidence {block.confidence}; rule 14): dropped"
    return block, ""


def _merge(tiers: dict[str, list[Block]], tier: str, block: Block) -> None:
    """Rule 15: a block takes the place of the one with its ``id``, in whichever tier it was."""
    for blocks in tiers.values():
        blocks[:] = [b for b in blocks if b.id != block.id]
    tiers[tier].append(block)


def _cursor(raw: Any) -> tuple[Cursor | None, list[str]]:
    if raw is None:
        return None, []
    try:
        cursor = msgspec.convert(raw, Cursor)
    except msgspec.ValidationError as exc:
        return None, [f"todo.cursor: {exc}: not taken"]
    untargeted = cursor.next in UNTARGETED
    if untargeted and cursor.targetId is not None:
        return None, [f"todo.cursor: targetId must be null for {cursor.next}: not taken"]
    if not untargeted and (cursor.targetId is None or cursor.targetId < 1):
        return None, [f"todo.cursor: targetId must be a positive integer for {cursor.next}: not taken"]
    return cursor, []


def _capabilities(raw: dict[str, Any], kept: Snapshot) -> tuple[dict[str, Any], ...]:
    written = raw.get("capabilities")
    if isinstance(written, list) and all(isinstance(c, dict) for c in written):
        return tuple(written)
    return kept.capabilities
