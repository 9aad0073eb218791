"""How a session's snapshot lives between rounds: blocks age, ephemeral ones expire, working ones
last the task, and a snapshot that outgrows its room sends its weakest blocks to cold storage
(``cold``), to be rehydrated when a query asks for their tags.

The system owns ``runtime`` and the todo projection (``system_snapshot``): the
round counts the session's requests, the todo progress is computed from the
list a client sets.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime

import msgspec

from .cold import Cold, fit, kept_cold, rehydrate
from .snapshot import TIERS, Block, LimitsPolicy, Memory, Runtime, Snapshot, Todo, render_block

__all__ = ["AgingPolicy", "RoundFacts", "TodoItem", "age", "scope_core", "system_snapshot", "this_round", "todo_projection", "within_room"]


class AgingPolicy(msgspec.Struct, frozen=True):
    """How fast each tier's blocks decay, per round since they were written; and when ephemeral ones go."""

    core: float = 0.01
    working: float = 0.05
    ephemeral: float = 0.25
    longterm: float = 0.02
    ephemeral_rounds: int = 3


class TodoItem(msgspec.Struct, frozen=True):
    id: int
    title: str
    done: bool = False


class RoundFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the system knows of a round before the model answers."""

    round: int  # the session's, this request's
    workspace: str
    now: datetime
    startup_at: int  # the session's start, epoch milliseconds
    todo: tuple[TodoItem, ...] = ()
    query: str = ""  # what the request asks: placeholders whose tags it names come back


def this_round(
    previous: Snapshot | None,
    facts: RoundFacts,
    cold: Cold,
    room: int,
    count: Callable[[str], int],
    aging: AgingPolicy = AgingPolicy(),
    limits: LimitsPolicy = LimitsPolicy(),
    shared_core: Sequence[Block] = (),
    given: Collection[str] = (),
) -> tuple[Snapshot, Cold]:
    """The snapshot the model is shown this round, and what the session keeps cold beside it.

    The previous snapshot ages to this round, takes the system's fields as
    they are now (and ``shared_core``: the core blocks its memory scope keeps
    across sessions, which win over the session's own by id; ``given``: the
    ids of the core blocks the session's last round gave the scope, so one
    the scope no longer holds was dropped there, and does not come back from
    this session's snapshot), brings back the placeholders the query asks
    for, and sends its weakest blocks cold until it fits in ``room`` tokens.
    """
    task_done = bool(facts.todo) and all(item.done for item in facts.todo)
    aged = age(previous, facts.round, aging, limits, task_done) if previous is not None else None
    snapshot = system_snapshot(aged, facts.round, facts.workspace, facts.now, facts.startup_at, facts.todo)
    shared_core = within_room(shared_core, room, count)
    if shared_core or given:
        shared = {block.id for block in shared_core}
        dropped = set(given) - shared
        # A block another session wrote at a later round of its own is this round's here (rule: no round after the current).
        joined = (msgspec.structs.replace(b, round=min(b.round, facts.round)) for b in shared_core)
        core = sorted([*joined, *(b for b in snapshot.memory.core if b.id not in shared and b.id not in dropped)], key=lambda b: -b.quality)
        others = {tier: tuple(b for b in snapshot.memory.tier(tier) if b.id not in shared) for tier in TIERS if tier != "core"}
        snapshot = msgspec.structs.replace(snapshot, memory=Memory(core=tuple(core[: limits.max_blocks]), **others))
    stamp = snapshot.runtime.datetime
    snapshot = rehydrate(snapshot, facts.query, cold, stamp)
    back = {block.id for _, block in snapshot.memory.blocks() if block.rehydrated_at == stamp}
    snapshot, sent = fit(snapshot, room, count, keep=back)
    return snapshot, kept_cold(snapshot, Cold({**cold.payloads, **sent.payloads}, (*cold.shelved, *sent.shelved)))


# More characters than any one token holds (cl100k's longest is 128 bytes).
_TOKEN_CHARS = 256


def within_room(blocks: Sequence[Block], room: int, count: Callable[[str], int]) -> tuple[Block, ...]:
    """The best of a scope's core ``blocks`` whose text fits in ``room`` tokens together, best first.

    Core blocks are never sent cold (``fit``), so the snapshot's share of the
    budget holds for a scope's only if they are chosen within it: those past it
    are not shown this round, and stay the scope's (it keeps what a round was not shown).
    """
    kept: list[Block] = []
    used = 0
    for block in sorted(blocks, key=lambda b: -b.quality):
        text = render_block(block)
        if len(text) > (room - used) * _TOKEN_CHARS:
            continue  # it cannot fit: not counted (a block of megabytes took seconds to count on each request)
        cost = count(text)
        if used + cost <= room:
            kept.append(block)
            used += cost
    return tuple(kept)


def system_snapshot(previous: Snapshot | None, current: int, workspace: str, now: datetime, startup_at: int, todo: Sequence[TodoItem]) -> Snapshot:
    """The snapshot with the system's fields as they are this round (the model's fields from ``previous``)."""
    runtime = Runtime(round=current, workspace=workspace, datetime=now.isoformat(timespec="milliseconds").replace("+00:00", "Z"), startup_at=startup_at)
    cursor = previous.todo.cursor if previous is not None else None
    projection = msgspec.structs.replace(todo_projection(todo), cursor=cursor)
    if previous is None:
        return Snapshot(runtime=runtime, todo=projection)
    return msgspec.structs.replace(previous, runtime=runtime, todo=projection)


def todo_projection(todo: Sequence[TodoItem]) -> Todo:
    """``todo.summary``, ``total`` and ``step``, as the system computes them from the list: the step is the first not done."""
    done = sum(item.done for item in todo)
    step = next((i for i, item in enumerate(todo, 1) if not item.done), len(todo))
    summary = "no todo" if not todo else ("done" if done == len(todo) else f"in progress {done}/{len(todo)} (step {step})")
    return Todo(summary=summary, total=len(todo), step=step)


def age(snapshot: Snapshot, current: int, aging: AgingPolicy = AgingPolicy(), limits: LimitsPolicy = LimitsPolicy(), task_done: bool = False) -> Snapshot:
    """The snapshot at round ``current``: decay risen by each tier's rate, expired and faded blocks gone.

    Decay rises once per round since the snapshot was made (its
    ``runtime.round``), never again for rounds already counted: the model is
    shown the aged decay and writes it back, and a block that kept its old
    ``round`` must not age from it twice. Ephemeral blocks go
    ``ephemeral_rounds`` after the round they were written in; working blocks
    go when the task is done (the todo list complete); any block whose decay
    passes ``limits.max_decay`` has faded.
    """
    elapsed = max(current - snapshot.runtime.round, 0)
    tiers: dict[str, tuple[Block, ...]] = {}
    for tier in TIERS:
        kept = []
        for block in snapshot.memory.tier(tier):
            if tier == "ephemeral" and current - block.round >= aging.ephemeral_rounds or tier == "working" and task_done:
                continue
            decay = _rounded(1.0 - (1.0 - block.decay) * (1.0 - getattr(aging, tier)) ** elapsed) if elapsed else block.decay
            if decay <= limits.max_decay:
                kept.append(msgspec.structs.replace(block, decay=decay))
        tiers[tier] = tuple(sorted(kept, key=lambda b: -b.quality))
    return msgspec.structs.replace(snapshot, memory=Memory(**tiers))


def _rounded(value: float) -> float:
    """``value`` to four decimals, as the snapshot shows it."""
    return float(f"{value:.4f}")


def scope_core(stored: Sequence[Block], kept: Sequence[Block], seen: Collection[str], limits: LimitsPolicy = LimitsPolicy()) -> tuple[Block, ...]:
    """A memory scope's core once a session's round keeps ``kept``, having been shown the scope's ``seen`` ids.

    What the round kept wins; a block it was shown and left out is gone (the model
    dropped it); a block it was never shown (another session of the scope wrote it
    meanwhile) stays. Best first, at most ``limits.max_blocks`` (rule 16).
    """
    ids = {block.id for block in kept}
    others = [block for block in stored if block.id not in ids and block.id not in seen]
    return tuple(sorted([*kept, *others], key=lambda b: -b.quality)[: limits.max_blocks])
