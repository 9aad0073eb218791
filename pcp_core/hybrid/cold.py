"""Cold memory: blocks kept aside when a snapshot outgrows its room, and brought back when a query asks for them.

The weakest ``longterm`` and ``working`` blocks become ``tag_ref``
placeholders (spec: tag-based cold memory): the model sees their ``tag_id``,
``tag_summary`` and tags, the system keeps their payload. When even the
placeholders do not fit, the weakest of them are shelved: out of the snapshot,
kept by the system with their payload. A placeholder, shown or shelved, whose
tags the query names comes back whole (``content_state: active``,
``rehydrated_at``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import msgspec

from ..pages.logical import short_hash
from ..text.terms import terms
from .snapshot import Block, Snapshot, render, render_block

__all__ = ["Cold", "Shelved", "fit", "kept_cold", "rehydrate"]

MAX_SHELVED = 256  # placeholders kept out of the snapshot; past it the weakest are forgotten


class Shelved(msgspec.Struct, frozen=True):
    """A placeholder that no longer fits in the snapshot, and the tier it comes back to."""

    tier: str
    block: Block


class Cold(msgspec.Struct, frozen=True):
    """What the system keeps of the blocks it sent cold."""

    payloads: dict[str, str] = {}  # by tag_id
    shelved: tuple[Shelved, ...] = ()


def fit(snapshot: Snapshot, max_tokens: int, count: Callable[[str], int], keep: Collection[str] = ()) -> tuple[Snapshot, Cold]:
    """The snapshot within ``max_tokens``, and what it sent cold (payloads by ``tag_id``, shelved placeholders).

    The weakest active ``longterm`` and ``working`` blocks become placeholders;
    placeholders may take half the room, past which the weakest of them are
    shelved (so that the best blocks stay whole, the next ones are shown by
    their placeholder, the weakest only kept). Core and ephemeral blocks are
    never sent cold (the one is the identity, the other is gone soon anyway),
    nor are the blocks in ``keep`` (those just brought back for the query).
    What still does not fit stays: the snapshot is then over its share.
    """
    payloads: dict[str, str] = {}
    shelved: list[Shelved] = []
    while _over(render(snapshot), max_tokens, count):
        candidates = sorted(
            ((block.quality, tier, block) for tier in ("longterm", "working") for block in snapshot.memory.tier(tier) if block.id not in keep),
            key=lambda c: c[0],
        )
        active = [(tier, block) for _, tier, block in candidates if block.content_state == "active"]
        placeholders = [(tier, block) for _, tier, block in candidates if block.content_state == "tag_ref"]
        crowded = sum(count(render_block(block)) for _, block in placeholders) > max_tokens // 2
        if placeholders and (crowded or not active):
            tier, weakest = placeholders[0]
            shelved.append(Shelved(tier, weakest))
            snapshot = _replace_block(snapshot, tier, weakest, None)
        elif active:
            tier, weakest = active[0]
            tag_id = "tag-" + short_hash(weakest.id, weakest.content, length=12)
            payloads[tag_id] = weakest.content
            snapshot = _replace_block(
                snapshot,
                tier,
                weakest,
                msgspec.structs.replace(weakest, content="", content_state="tag_ref", tag_id=tag_id, tag_summary=_summary(weakest.content)),
            )
        else:
            break
    return snapshot, Cold(payloads, tuple(shelved))


def _over(text: str, max_tokens: int, count: Callable[[str], int]) -> bool:
    """Whether ``text`` takes more than ``max_tokens``."""
    # A token is at least a byte: a text of fewer bytes than the room fits without being counted.
    return len(text.encode()) > max_tokens and count(text) > max_tokens


def _summary(content: str, chars: int = 60) -> str:
    """A placeholder's ``tag_summary``: the content's start, on one line."""
    line = " ".join(content.split())
    return line if len(line) <= chars else line[: chars - 1].rstrip() + "…"


def rehydrate(snapshot: Snapshot, query: str, cold: Cold, now: str) -> Snapshot:
    """Placeholders, shown or shelved, whose tags the query names come back whole (``content_state: active``)."""
    asked = set(terms(query))
    shown = list(snapshot.memory.blocks())
    for tier, block in [*shown, *((s.tier, s.block) for s in cold.shelved)]:
        if block.content_state != "tag_ref" or block.tag_id not in cold.payloads:
            continue
        if asked & {t for tag in block.tags for t in terms(tag)}:
            restored = msgspec.structs.replace(
                block, content=cold.payloads[block.tag_id], content_state="active", tag_id=None, tag_summary=None, rehydrated_at=now
            )
            snapshot = _replace_block(snapshot, tier, block, restored)
    return snapshot


def kept_cold(snapshot: Snapshot, cold: Cold) -> Cold:
    """``cold`` as ``snapshot`` leaves it: the shelved placeholders whose id it does not hold (again), and the payloads of its placeholders and theirs."""
    held = {block.id for _, block in snapshot.memory.blocks()}
    shelved = sorted((s for s in cold.shelved if s.block.id not in held), key=lambda s: -s.block.quality)[:MAX_SHELVED]
    named = {b.tag_id for b in [*(b for _, b in snapshot.memory.blocks()), *(s.block for s in shelved)] if b.tag_id is not None}
    return Cold({tag: text for tag, text in cold.payloads.items() if tag in named}, tuple(shelved))


def _replace_block(snapshot: Snapshot, tier: str, old: Block, new: Block | None) -> Snapshot:
    """``old`` replaced by ``new`` in ``tier`` (None: taken out); an ``old`` not in the tier is added, in its place by quality."""
    blocks = snapshot.memory.tier(tier)
    if old in blocks:
        blocks = tuple(b for b in (new if b is old else b for b in blocks) if b is not None)
    elif new is not None:
        blocks = tuple(sorted([*blocks, new], key=lambda b: -b.quality))
    return msgspec.structs.replace(snapshot, memory=msgspec.structs.replace(snapshot.memory, **{tier: blocks}))
