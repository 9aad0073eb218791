"""PACT (Positioned Adaptive Context Tree): components pinned to a place in a conversation.

A component is a piece of context an application attaches without rewriting
its client: a fact about a message, a reminder for three turns, a note at
system level. It is addressed by coordinates ``(depth, position, offset)``:
depth 0 is the conversation's current (last) message, 1 the one before, and
so on; -1 is system level. Position 0 is a message's core, 1 and up the
components attached to it; offset orders them around the core (below 0
before it, from 0 after it).

A session's components form a ``Tree``, which each request of the session
advances (``advance``): when the conversation grows, permanent and sticky
components move deeper by as much (the Overlap Demotion Invariant, ODI), so
they stay with their message; system level never moves, offsets never change.
Temporary components (a ``ttl``) and cyclic ones (a cadence) keep their depth
instead: they expire after ``ttl`` turns, or come back every ``cad`` turns.
A turn is a request that moves the conversation on; a retry of the same
messages is not one.

The tree knows its conversation by the hash chain of its messages (one link
a message, as sessions do): a request that shares only a prefix of it (the
client edited or cut the conversation) keeps the moving components of that
prefix and drops those of the messages it changed, as a fork keeps only the
pages of the common prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec

from ..conversation import Conversation
from ..pages.logical import short_hash
from ..session import chain_links, common_prefix
from .address import HIGHEST, Coordinates, PactError, Selector, parse_coordinates, parse_selector

__all__ = [
    "MAX_COMPONENTS",
    "Component",
    "ComponentSpec",
    "Coordinates",
    "PactError",
    "Selector",
    "Tree",
    "advance",
    "conversation_links",
    "coordinates",
    "delete",
    "insert",
    "is_live",
    "node",
    "on_request",
    "parse_coordinates",
    "parse_selector",
    "select",
    "snapshot",
]

MAX_COMPONENTS = 1000  # in one session: they are rendered into every prompt
KEY = r"\A[A-Za-z0-9._:-]{1,128}\Z"  # keys name components in URLs (\Z: "$" would let a final newline in)


class ComponentSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A component as a client asks for it (``POST …/components``, or inline in ``pcp_components``)."""

    at: str
    content: str
    ttl: Annotated[int, msgspec.Meta(ge=1, le=HIGHEST)] | None = None  # turns it lives; None: permanent
    cadence: Annotated[int, msgspec.Meta(ge=1, le=HIGHEST)] | None = None  # it comes back every ``cadence`` turns
    key: Annotated[str, msgspec.Meta(pattern=KEY)] | None = None
    tags: Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]], msgspec.Meta(max_length=32)] = []

    def __post_init__(self) -> None:
        parse_coordinates(self.at)  # a PactError is a ValueError: decoding reports it with where it is


Kind = Literal["system", "moving", "relative"]


class Component(msgspec.Struct, frozen=True, kw_only=True):
    """A component as a tree keeps it: PACT v0.1's node fields, and where it is now."""

    id: str
    content: str
    depth: int  # counted back from the last message the tree saw; -1: system level
    position: int
    offset: int
    ttl: int | None = None
    cad: int | None = None
    key: str | None = None
    tags: list[str] = []
    created_at_ns: int
    creation_index: int
    born: int | None = None  # the turn it was first rendered in; None: not yet

    @property
    def kind(self) -> Kind:
        """System level never moves; permanent and sticky components move with their message (ODI); the rest keep their depth."""
        if self.depth < 0:
            return "system"
        if (self.ttl is None and self.cad is None) or (self.ttl == 1 and self.cad == 1):
            return "moving"
        return "relative"


class Tree(msgspec.Struct, frozen=True, kw_only=True):
    """A session's components, and the conversation they were last placed in."""

    components: list[Component] = []
    count: int | None = None  # messages (after the leading system ones) of the last request; None: none seen yet
    chain: list[str] = []  # their hash chain (``session.chain_links``)
    turn: int = 0  # requests that moved the conversation on
    created: int = 0  # components ever inserted: the next one's creation_index


def coordinates(component: Component) -> Coordinates:
    """Where ``component`` is pinned."""
    return Coordinates(component.depth, component.position, component.offset)


def is_live(component: Component, turn: int) -> bool:
    """Whether ``component`` renders at ``turn``: within its ttl, or within its ttl of a cadence's return."""
    if component.born is None or component.ttl is None:
        return True
    age = turn - component.born
    return age < component.ttl if component.cad is None else age % component.cad < component.ttl


def advance(tree: Tree, links: Sequence[str]) -> Tree:
    """The tree as a request whose conversation has the hash chain ``links`` finds it.

    The same conversation again (a retry) is the same turn. Otherwise a turn
    passes: moving components follow their message (ODI), or go with it when
    the request no longer holds it as it was; temporary ones whose ttl has
    run out expire; components not rendered yet are born in this turn.
    """
    links = list(links)
    same = tree.count is not None and tree.count == len(links) and tree.chain[-1:] == links[-1:]
    turn = tree.turn if same else tree.turn + 1
    kept = common_prefix(tree.chain, links) if tree.count is not None else len(links)
    components = []
    for c in tree.components:
        if not same and tree.count is not None and c.kind == "moving":
            anchor = tree.count - 1 - c.depth
            if not 0 <= anchor < kept:
                continue  # its message was edited away (it stays with the conversation that holds it), or never was
            c = msgspec.structs.replace(c, depth=len(links) - 1 - anchor)
        born = turn if c.born is None else c.born
        if c.born is None:
            c = msgspec.structs.replace(c, born=born)
        if c.cad is None and c.ttl is not None and turn - born >= c.ttl:
            continue  # expired
        components.append(c)
    return msgspec.structs.replace(tree, components=components, count=len(links), chain=links, turn=turn)


def insert(tree: Tree, spec: ComponentSpec, now_ns: int, *, rendered_now: bool = False) -> tuple[Tree, Component]:
    """``tree`` with the component ``spec`` asks for (one of the same key is replaced), and that component.

    Depths count back from the tree's last message; before the tree has seen
    its conversation, from the last message of the request that comes next.
    ``rendered_now``: the component arrived with a request, so this turn is its first.
    """
    at = parse_coordinates(spec.at)
    if tree.count is not None and at.depth >= tree.count:
        held = f"{tree.count} messages, d0 to d{tree.count - 1}" if tree.count else "no messages yet (only system level, d-1)"
        raise PactError(f"{spec.at!r}: the conversation holds {held}")
    others = [c for c in tree.components if spec.key is None or c.key != spec.key]
    if len(others) >= MAX_COMPONENTS:
        raise PactError(f"this session holds {len(others)} components, the most it keeps; delete some first")
    ttl = 1 if spec.cadence is not None and spec.ttl is None else spec.ttl  # a cadence alone shows once each time
    component = Component(
        id="pc-" + short_hash(str(tree.created), str(now_ns), spec.content, length=12),
        content=spec.content, depth=at.depth, position=at.position, offset=at.offset, ttl=ttl, cad=spec.cadence,
        key=spec.key, tags=list(spec.tags), created_at_ns=now_ns, creation_index=tree.created,
        born=tree.turn if rendered_now else None,
    )  # fmt: skip
    return msgspec.structs.replace(tree, components=[*others, component], created=tree.created + 1), component


def on_request(tree: Tree, links: Sequence[str], inline: Sequence[ComponentSpec], now_ns: int) -> Tree:
    """The tree as one request leaves it: advanced to its conversation, with the components it carried inline."""
    tree = advance(tree, links)
    for i, spec in enumerate(inline):
        if any(_carried(c, spec, tree.turn) for c in tree.components):
            continue  # a retry carries its components again: they are there already
        try:
            tree, _ = insert(tree, spec, now_ns, rendered_now=True)
        except PactError as error:
            raise PactError(f"pcp_components[{i}]: {error}", param=f"pcp_components.[{i}]") from None
    return tree


def _carried(component: Component, spec: ComponentSpec, turn: int) -> bool:
    """Whether ``component`` is the one ``spec`` asked for in a request of this turn."""
    same = (component.content, component.key, str(coordinates(component))) == (spec.content, spec.key, str(parse_coordinates(spec.at)))
    return same and component.born == turn and component.cad == spec.cadence


def conversation_links(conversation: Conversation, chained: Sequence[str]) -> list[str]:
    """The hash chain of every message of ``conversation`` after its head, from that of its chained ones (``Resolution.links``).

    Those are the history (and a File-block query); the query's link, when
    it is not among them, is one more hash.
    """
    n = len(conversation.history)
    if conversation.query is None or len(chained) > n:
        return list(chained[: n + 1])
    return [*chained[:n], *chain_links([conversation.query], after=chained[n - 1] if n else "")]


def delete(tree: Tree, ref: str) -> tuple[Tree, Component | None]:
    """``tree`` without the component whose id (else whose key) is ``ref``, and that component (None: no such one)."""
    found = next((c for c in tree.components if c.id == ref), None) or next((c for c in tree.components if c.key == ref), None)
    if found is None:
        return tree, None
    return msgspec.structs.replace(tree, components=[c for c in tree.components if c is not found]), found


def select(tree: Tree, selector: Selector | None = None) -> list[Component]:
    """The components ``selector`` matches (all without one), in the order they render."""
    return sorted((c for c in tree.components if selector is None or selector.matches(c)), key=render_order)


def render_order(component: Component) -> tuple[int, int, bool, int, int, int]:
    """System level first, then the oldest message first; around a message, before its core (offset < 0) then after; then by position, offset and creation."""
    return min(component.depth, 0), -component.depth, component.offset >= 0, component.position, component.offset, component.creation_index


def node(component: Component, tree: Tree) -> dict[str, object]:
    """A component as PACT v0.1 writes a node, with its coordinates and whether it renders in the tree's turn."""
    return {
        "id": component.id,
        "parent_id": parent_id(component, tree),
        "offset": component.offset,
        "ttl": component.ttl,
        "cad": component.cad,
        "created_at_ns": component.created_at_ns,
        "creation_index": component.creation_index,
        "key": component.key,
        "tags": component.tags,
        "content": component.content,
        "coordinates": str(coordinates(component)),
        "live": is_live(component, tree.turn),
    }


def parent_id(component: Component, tree: Tree) -> str | None:
    """The container a component hangs from: the system region, or its message (named by its link: ids must not move with ODI)."""
    if component.depth < 0:
        return "^sys"
    if tree.count is None or component.depth >= tree.count:
        return None  # not placed yet
    return "m:" + tree.chain[tree.count - 1 - component.depth][:16]


def snapshot(tree: Tree, session_id: str) -> dict[str, object]:
    """The whole tree as a PACT v0.1 snapshot.

    Under the root, the regions: ``^sys`` (system level), ``^seq`` (the
    history) and ``^ah`` (the current message); in the last two, one
    container for each message components hang from, named by its link.
    Components not placed yet (the tree has not seen its conversation, or
    their depth is beyond it) are listed apart, as ``pending``.
    """
    system: list[object] = []
    messages: dict[str, dict[str, Any]] = {}
    pending: list[object] = []
    for c in select(tree):
        parent, shown = parent_id(c, tree), node(c, tree)
        if parent is None:
            pending.append(shown)
        elif parent == "^sys":
            system.append(shown)
        else:
            region = "^ah" if c.depth == 0 else "^seq"
            messages.setdefault(parent, {"id": parent, "parent_id": region, "coordinates": f"d{c.depth},0,0", "children": []})["children"].append(shown)
    regions = [{"id": "^sys", "parent_id": "^root", "coordinates": "d-1,0,0", "children": system}]
    for region in ("^seq", "^ah"):
        regions.append({"id": region, "parent_id": "^root", "children": [m for m in messages.values() if m["parent_id"] == region]})
    return {
        "version": "pact/0.1",
        "session": session_id,
        "turn": tree.turn,
        "messages": tree.count,
        "root": {"id": "^root", "children": regions},
        "pending": pending,
    }
