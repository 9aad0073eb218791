"""How a session's snapshot lives between rounds: blocks age, ephemeral ones expire, working ones
last the task, and a snapshot that outgrows its room sends its weakest blocks to cold storage
(``tag_ref`` placeholders), to be rehydrated when a query asks for their tags.

The system owns ``runtime`` and the todo projection (``system_snapshot``): the
round counts the session's requests, the todo progress is computed from the
list a client sets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import msgspec

from ..pages import short_hash
from ..terms import terms
from .snapshot import TIERS, Block, Limits, Memory, Runtime, Snapshot, Todo

__all__ = ["Aging", "TodoItem", "age", "fit", "rehydrate", "render", "system_snapshot"]


class Aging(msgspec.Struct, frozen=True):
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


def system_snapshot(previous: Snapshot | None, current: int, workspace: str, now: datetime, startup_at: int, todo: Sequence[TodoItem]) -> Snapshot:
    """The snapshot with the system's fields as they are this round (the model's fields from ``previous``)."""
    runtime = Runtime(round=current, workspace=workspace, datetime=now.isoformat(timespec="milliseconds").replace("+00:00", "Z"), startup_at=startup_at)
    done = sum(item.done for item in todo)
    step = min(done + 1, len(todo)) if todo else 0
    summary = "no todo" if not todo else ("done" if done == len(todo) else f"in progress {done}/{len(todo)} (step {step})")
    cursor = previous.todo.cursor if previous is not None else None
    projection = Todo(summary=summary, total=len(todo), step=step, cursor=cursor)
    if previous is None:
        return Snapshot(runtime=runtime, todo=projection)
    return msgspec.structs.replace(previous, runtime=runtime, todo=projection)


def age(snapshot: Snapshot, current: int, aging: Aging = Aging(), limits: Limits = Limits(), task_done: bool = False) -> Snapshot:
    """The snapshot a round later: decay rises by each tier's rate, expired and faded blocks go.

    Ephemeral blocks go ``ephemeral_rounds`` after they were written; working
    blocks go when the task is done (the todo list complete); any block whose
    decay passes ``limits.max_decay`` has faded.
    """
    tiers: dict[str, tuple[Block, ...]] = {}
    for tier in TIERS:
        kept = []
        for block in snapshot.memory.tier(tier):
            since = max(current - block.round, 0)
            if tier == "ephemeral" and since >= aging.ephemeral_rounds or tier == "working" and task_done:
                continue
            decay = 1.0 - (1.0 - block.decay) * (1.0 - getattr(aging, tier)) ** since
            if decay <= limits.max_decay:
                kept.append(msgspec.structs.replace(block, decay=_rounded(decay)))
        tiers[tier] = tuple(kept)
    return msgspec.structs.replace(snapshot, memory=Memory(**tiers))


def _rounded(value: float) -> float:
    return float(f"{value:.4f}")


def fit(snapshot: Snapshot, max_tokens: int, count: Callable[[str], int]) -> tuple[Snapshot, dict[str, str]]:
    """The snapshot within ``max_tokens``, and the payloads of the blocks sent to cold storage, by ``tag_id``.

    The weakest active ``longterm`` and ``working`` blocks become placeholders
    first; core and ephemeral blocks are never sent cold (the one is the
    identity, the other is gone soon anyway).
    """
    cold: dict[str, str] = {}
    while count(render(snapshot)) > max_tokens:
        candidates = [(block.quality, tier, block) for tier in ("longterm", "working") for block in snapshot.memory.tier(tier) if block.content_state == "active"]
        if not candidates:
            break
        _, tier, weakest = min(candidates, key=lambda c: c[0])
        tag_id = "tag-" + short_hash(weakest.id, weakest.content, length=12)
        cold[tag_id] = weakest.content
        placeholder = msgspec.structs.replace(weakest, content="", content_state="tag_ref", tag_id=tag_id, tag_summary=weakest.content[:40])
        snapshot = _replace_block(snapshot, tier, weakest, placeholder)
    return snapshot, cold


def rehydrate(snapshot: Snapshot, query: str, cold: Mapping[str, str], now: str) -> Snapshot:
    """Placeholders whose tags the query names come back whole (``content_state: active``)."""
    asked = set(terms(query))
    for tier, block in list(snapshot.memory.blocks()):
        if block.content_state != "tag_ref" or block.tag_id not in cold:
            continue
        if asked & {t for tag in block.tags for t in terms(tag)}:
            restored = msgspec.structs.replace(block, content=cold[block.tag_id], content_state="active", rehydrated_at=now)
            snapshot = _replace_block(snapshot, tier, block, restored)
    return snapshot


def render(snapshot: Snapshot) -> str:
    """The snapshot as the model is shown it: JSON, one line."""
    return json.dumps(msgspec.to_builtins(snapshot), ensure_ascii=False, separators=(",", ":"))


def _replace_block(snapshot: Snapshot, tier: str, old: Block, new: Block) -> Snapshot:
    blocks = tuple(new if b is old else b for b in snapshot.memory.tier(tier))
    return msgspec.structs.replace(snapshot, memory=msgspec.structs.replace(snapshot.memory, **{tier: blocks}))
