"""Hybrid mode's ``memory.core`` kept by a memory scope, so that it outlives a session (``proxy.hybrid.CoreMemory``).

A session in Hybrid mode that names a scope (``x-pcp-memory``) is shown the
scope's core blocks beside its own, and what its round keeps of them is the
scope's again (``pcp_core.hybrid.scope_core`` merges it with what other
sessions wrote meanwhile). Kept as the session's snapshot is: a ``KeyedStore``
under ``PCP_DATA_DIR/memory/core`` (or in Redis, never expired), sealed with ``PCP_DATA_KEY``. Dropping the
scope drops them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

import msgspec

from pcp_core.hybrid import Block, LimitsPolicy, scope_core

from ..storage.base import Store
from ..storage.keyed_store import KeyedStore, store_key
from ..storage.sealing import Sealer

__all__ = ["ScopeCores"]

# The scope key (``scope_key``) holds the caller's namespace already.
_NAMESPACE = "core"


class _Core(msgspec.Struct, frozen=True):
    blocks: tuple[Block, ...] = ()


class ScopeCores(KeyedStore[_Core]):
    def __init__(self, store: Store | Path, sealer: Sealer | None = None, limits: LimitsPolicy = LimitsPolicy()):
        """Core blocks kept in ``store``, sealed with ``sealer``, merged under ``limits``."""
        super().__init__(store, _Core, "the core blocks of a memory scope", sealer)
        self.limits = limits

    def recall(self, scope: str) -> Sequence[Block]:
        """The scope's core blocks (may read the disk: call from a thread)."""
        core = self.get(_NAMESPACE, scope)
        return core.blocks if core is not None else ()

    def keep(self, scope: str, blocks: Sequence[Block], seen: Collection[str]) -> None:
        """What a round kept of the core, having been shown the scope's ``seen`` ids."""

        def merged(stored: _Core | None) -> _Core | None:
            """The stored blocks merged with ``blocks``, or None where nothing changes."""
            kept = scope_core(stored.blocks if stored is not None else (), blocks, seen, self.limits)
            return None if kept == (stored.blocks if stored is not None else ()) else _Core(kept)

        self._change(store_key(_NAMESPACE, scope), merged)

    def forget(self, scope: str) -> None:
        """The scope's core gone (it is dropped): kept empty, which reads as none."""
        self._change(store_key(_NAMESPACE, scope), lambda stored: _Core() if stored is not None else None)
