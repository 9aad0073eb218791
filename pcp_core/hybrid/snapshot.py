"""The Hybrid v3 snapshot: its shape, and how a model's snapshot is read against the previous one.

The model ends its answer with ``<<<CONTEXT>>>`` and a JSON snapshot of its
working state (spec: docs/spec/context-protocol-hybrid-v3.md). Some of it is
the system's (``version``, ``runtime``, the todo projection): whatever the
model wrote there, the system's values stand. The rest, the memory blocks and
the todo cursor, the model may write; a block that breaks a rule is dropped,
a cursor that breaks its shape is not taken, and every violation is named
(``Violation``: the rule it breaks, for counting, and what happened, for the log).
``check`` says whether a snapshot the system keeps holds to every rule.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

__all__ = [
    "TIERS",
    "Block",
    "Cursor",
    "LimitsPolicy",
    "Memory",
    "Reading",
    "Runtime",
    "Snapshot",
    "Todo",
    "Violation",
    "block_problems",
    "check",
    "parse_context",
    "read_snapshot",
    "render",
    "render_block",
]

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
        """The blocks of the tier ``name``."""
        return getattr(self, name)

    def blocks(self) -> Iterable[tuple[str, Block]]:
        """Every block with its tier, tier by tier."""
        return ((tier, block) for tier in TIERS for block in self.tier(tier))


class Cursor(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    v: Literal[1]
    phase: Phase
    next: Next
    targetId: int | None
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


class LimitsPolicy(msgspec.Struct, frozen=True):
    """What a block must meet to be kept (rule 14: low-quality blocks are omitted), and how many a tier holds."""

    max_decay: float = 0.9
    min_confidence: float = 0.2
    # Rule 16 asks the model to avoid redundant entries; past this the weakest go, so that
    # one verbose reply cannot make every later prompt carry hundreds of blocks.
    max_blocks: int = 64


class Violation(msgspec.Struct, frozen=True):
    """One broken rule: ``rule`` names it for counting (a metric's label), ``text`` says what happened."""

    rule: str
    text: str

    def __str__(self) -> str:
        return self.text


class Reading(msgspec.Struct, frozen=True):
    """A model's snapshot as the system takes it, and what in it broke the rules."""

    snapshot: Snapshot
    violations: tuple[Violation, ...] = ()


def render(snapshot: Snapshot) -> str:
    """The snapshot as the model is shown it (and the API serves it): JSON, one line."""
    return json.dumps(msgspec.to_builtins(snapshot), ensure_ascii=False, separators=(",", ":"))


def render_block(block: Block) -> str:
    """One block as it stands in ``render``'s text."""
    return json.dumps(msgspec.to_builtins(block), ensure_ascii=False, separators=(",", ":"))


def parse_context(text: str | None, separators: int = 1) -> tuple[Any, list[Violation]]:
    """The JSON a model wrote after the separator, decoded (None: there is none to read), and the rules it broke.

    Rules 4-6 want bare JSON and nothing else. A snapshot wrapped in a
    Markdown fence, or followed by stray text, is still read (the violation is
    named); one that is not JSON at all is not, and the previous snapshot stands.
    """
    if text is None:
        return None, [Violation("no_context", "no <<<CONTEXT>>> section (rule 1): the previous snapshot stands")]
    problems = [Violation("separators", f"{separators} separators (rule 3): the last section is read")] if separators > 1 else []
    fenced = text.startswith("```")
    if fenced:
        text = text.strip("`").removeprefix("json").strip()
        problems.append(Violation("not_bare_json", "the JSON is wrapped in Markdown (rule 6): read without it"))
    try:
        return msgspec.json.decode(text), problems
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):  # not JSON, a number past a double's range, too deep
        pass
    try:
        raw, end = json.JSONDecoder(parse_constant=_no_constant).raw_decode(text)
    except (ValueError, RecursionError):
        return None, [*problems, Violation("not_json", "the context is not JSON (rules 4-5): the previous snapshot stands")]
    return raw, [*problems, Violation("not_bare_json", f"{len(text) - end} characters follow the JSON (rule 6): read without them")]


def _no_constant(name: str) -> Any:
    """Refuse NaN and Infinity in a snapshot's JSON."""
    raise ValueError(f"{name} is not JSON")  # JSON.parse refuses NaN and Infinity; so does the system


def read_snapshot(raw: Any, previous: Snapshot, system: Snapshot, limits: LimitsPolicy = LimitsPolicy()) -> Reading:
    """The snapshot the session keeps after a model wrote ``raw`` (decoded JSON).

    ``system`` carries the fields the system owns (version, runtime, the todo
    projection), which win over the model's; ``previous`` is the snapshot the
    model was shown. Memory blocks are merged into the previous ones by ``id``:
    a block the model rewrote replaces its old self, one it left out stays
    (the model may write only what changed), one it rewrote as faded (rule 14)
    goes. Not an object: the previous snapshot stands, with the system's fields.
    """
    kept = msgspec.structs.replace(previous, version=system.version, runtime=system.runtime, todo=_todo(previous.todo, system.todo))
    if not isinstance(raw, dict):
        return Reading(kept, (Violation("not_object", "the context is not a JSON object: the previous snapshot stands"),))
    violations = _system_fields_changed(raw, system)
    memory, dropped = _memory(raw.get("memory"), previous.memory, limits, system.runtime.round)
    cursor, wrong = _cursor((raw.get("todo") or {}).get("cursor") if isinstance(raw.get("todo"), dict) else None)
    todo = msgspec.structs.replace(kept.todo, cursor=cursor) if cursor is not None else kept.todo
    task = raw.get("active_task")
    snapshot = msgspec.structs.replace(
        kept, memory=memory, todo=todo, active_task=task if isinstance(task, str) else kept.active_task, capabilities=_capabilities(raw, kept)
    )
    return Reading(snapshot, (*violations, *dropped, *wrong))


def check(snapshot: Snapshot, limits: LimitsPolicy = LimitsPolicy()) -> list[str]:
    """What in a snapshot the system would keep breaks a rule (empty: it holds to them all)."""
    problems = []
    try:
        msgspec.json.decode(msgspec.json.encode(snapshot), type=Snapshot)  # the shape, as it is stored and shown
    except msgspec.ValidationError as exc:
        problems.append(f"shape: {exc}")
    seen: set[str] = set()
    for tier in TIERS:
        blocks = snapshot.memory.tier(tier)
        if any(a.quality < b.quality for a, b in zip(blocks, blocks[1:])):
            problems.append(f"memory.{tier} is not ordered best first (rule 16)")
        if len(blocks) > limits.max_blocks:
            problems.append(f"memory.{tier} holds {len(blocks)} blocks, more than {limits.max_blocks}")
        for block in blocks:
            problems += [f"memory.{tier} {block.id}: {p}" for p in _block_problems(block, limits, snapshot.runtime.round)]
            if block.id in seen:
                problems.append(f"memory.{tier} {block.id}: the id is held twice (rule 15)")
            seen.add(block.id)
    if snapshot.todo.cursor is not None:
        problems += [str(v) for v in _cursor(msgspec.to_builtins(snapshot.todo.cursor))[1]]
    return problems


def block_problems(block: Block, limits: LimitsPolicy = LimitsPolicy()) -> list[str]:
    """What in one block, given outside a round (a memory import), breaks the rules a round's block keeps to
    (rules 12-14: decay and confidence in [0, 1] and within the limits; a round of 0 or more)."""
    problems = _block_problems(block, limits, max(block.round, 0))
    if block.round < 0:
        problems.append(f"round {block.round} is before the first round (0)")
    if block.content_state == "tag_ref":
        problems.append("a placeholder (content_state tag_ref) is the system's, made for a round: give the block whole")
    return problems


def _block_problems(block: Block, limits: LimitsPolicy, current: int) -> list[str]:
    """What is wrong with ``block`` under ``limits``, by the protocol's rules."""
    problems = []
    for name in ("decay", "confidence"):
        value = getattr(block, name)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            problems.append(f"{name} {value} is outside [0, 1] (rules 12-13)")
    if block.decay > limits.max_decay or block.confidence < limits.min_confidence:
        problems.append(f"low quality (decay {block.decay}, confidence {block.confidence}; rule 14)")
    if block.round > current:
        problems.append(f"round {block.round} is after the current round {current}")
    if (block.content_state == "tag_ref") != (block.tag_id is not None):
        problems.append("a placeholder has a tag_id, an active block none")
    return problems


def _todo(previous: Todo, system: Todo) -> Todo:
    """The model's todo list, keeping the previous cursor where the model gave none."""
    return msgspec.structs.replace(system, cursor=previous.cursor if system.cursor is None else system.cursor)


def _system_fields_changed(raw: dict[str, Any], system: Snapshot) -> list[Violation]:
    """Rule 8: the system's fields, as the model wrote them, where they differ (they are restored)."""
    owned = msgspec.to_builtins(system)
    changed = [] if raw.get("version", owned["version"]) == owned["version"] else ["version"]
    for part, fields in (("runtime", ("round", "workspace", "datetime", "startup_at")), ("todo", ("summary", "total", "step"))):
        written = raw.get(part)
        if isinstance(written, dict):
            changed += [f"{part}.{f}" for f in fields if f in written and written[f] != owned[part][f]]
    return [Violation("system_field", f"{field} is the system's: restored (rule 8)") for field in changed]


def _memory(raw: Any, previous: Memory, limits: LimitsPolicy, current: int) -> tuple[Memory, list[Violation]]:
    """The memory tiers the model wrote, checked against the previous ones, and what it broke."""
    if raw is None:
        return previous, []
    if not isinstance(raw, dict):
        return previous, [Violation("memory_shape", "memory is not an object: the previous memory stands")]
    problems = [Violation("tier", f"memory.{name} is not a tier (rule 10): dropped") for name in raw if name not in TIERS]
    tiers: dict[str, list[Block]] = {tier: list(previous.tier(tier)) for tier in TIERS}
    written: dict[str, Block] = {}  # the blocks of this reply, by id
    placeholders = {b.id: b for _, b in previous.blocks() if b.content_state == "tag_ref"}
    for tier in TIERS:
        items = raw.get(tier, [])
        if not isinstance(items, list):
            problems.append(Violation("memory_shape", f"memory.{tier} is not a list: the previous blocks stand"))
            continue
        for i, item in enumerate(items):
            block, problem = _block(item, limits, current, placeholders)
            where = f"memory.{tier}[{i}]"
            if problem is not None:
                problems.append(Violation(problem.rule, f"{where}: {problem.text}"))
            if block is None:
                continue
            if block.id in written:  # rule 15 in one reply: the better of the two stays
                problems.append(Violation("duplicate_id", f"{where}: the id {block.id!r} is written twice (rule 15): the better block kept"))
                if block.quality <= written[block.id].quality:
                    continue
            written[block.id] = block
            # A block written below the limits (rule 14) is not kept, and takes its old self with it: it has faded.
            _merge(tiers, tier, block, keep=problem is None or problem.rule != "block_quality")
    return Memory(**{tier: _best_first(tier, blocks, limits, problems) for tier, blocks in tiers.items()}), problems


def _best_first(tier: str, blocks: list[Block], limits: LimitsPolicy, problems: list[Violation]) -> tuple[Block, ...]:
    """Rule 16: the tier best first; beyond ``limits.max_blocks`` the weakest go."""
    ranked = sorted(blocks, key=lambda b: -b.quality)
    if len(ranked) > limits.max_blocks:
        problems.append(Violation("too_many", f"memory.{tier} holds {len(ranked)} blocks: the {len(ranked) - limits.max_blocks} weakest dropped (rule 16)"))
    return tuple(ranked[: limits.max_blocks])


def _block(item: Any, limits: LimitsPolicy, current: int, placeholders: dict[str, Block]) -> tuple[Block | None, Violation | None]:
    """The block ``item`` is (None: dropped), and the rule it broke (rules 11–14).

    A block below the limits (rule 14) comes back with its violation: it is
    not kept, and it takes its id's old block with it.
    """
    if not isinstance(item, dict):
        return None, Violation("block_shape", "not an object: dropped")
    missing = [f for f in REQUIRED if f not in item]
    if missing:
        return None, Violation("block_missing_field", f"missing {', '.join(missing)} (rule 11): dropped")
    try:
        block = msgspec.convert(item, Block)
    except msgspec.ValidationError as exc:
        return None, Violation("block_shape", f"{exc}: dropped")
    for name in ("decay", "confidence"):
        value = getattr(block, name)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            return None, Violation("block_range", f"{name} {value} is outside [0, 1] (rules 12-13): dropped")
    if block.content_state == "tag_ref":
        made = placeholders.get(block.id)
        if made is None or made.tag_id != block.tag_id:
            return None, Violation("placeholder", f"{block.id!r} is written as a placeholder the system did not make: dropped")
        return made, None  # a placeholder is the system's: kept as it was made
    if block.tag_id is not None or block.tag_summary is not None:
        block = msgspec.structs.replace(block, tag_id=None, tag_summary=None)  # written back whole: no longer cold
    if block.decay > limits.max_decay or block.confidence < limits.min_confidence:
        return block, Violation("block_quality", f"low quality (decay {block.decay}, confidence {block.confidence}; rule 14): dropped")
    if block.round > current:
        return msgspec.structs.replace(block, round=current), Violation("block_round", f"round {block.round} is after the current round {current}: set to it")
    return block, None


def _merge(tiers: dict[str, list[Block]], tier: str, block: Block, keep: bool = True) -> None:
    """Rule 15: a block takes the place of the one with its ``id``, in whichever tier it was."""
    for blocks in tiers.values():
        blocks[:] = [b for b in blocks if b.id != block.id]
    if keep:
        tiers[tier].append(block)


def _cursor(raw: Any) -> tuple[Cursor | None, list[Violation]]:
    """The cursor the model wrote, or None and why it was dropped."""
    if raw is None:
        return None, []
    try:
        cursor = msgspec.convert(raw, Cursor)
    except msgspec.ValidationError as exc:
        return None, [Violation("cursor", f"todo.cursor: {exc}: not taken")]
    untargeted = cursor.next in UNTARGETED
    if untargeted and cursor.targetId is not None:
        return None, [Violation("cursor", f"todo.cursor: targetId must be null for {cursor.next}: not taken")]
    if not untargeted and (cursor.targetId is None or cursor.targetId < 1):
        return None, [Violation("cursor", f"todo.cursor: targetId must be a positive integer for {cursor.next}: not taken")]
    return cursor, []


def _capabilities(raw: dict[str, Any], kept: Snapshot) -> tuple[dict[str, Any], ...]:
    """The capabilities the model wrote, or the kept ones when it wrote none that read."""
    written = raw.get("capabilities")
    if isinstance(written, list) and all(isinstance(c, dict) for c in written):
        return tuple(written)
    return kept.capabilities
