"""Hybrid v3 mode on requests (``turn``), its answers cut at the separator (``relay``), its store (``store``) and its API (``api``)."""

from .store import HybridState, HybridStore
from .turn import ContextTurn, CoreMemory, Hybrid

__all__ = ["ContextTurn", "CoreMemory", "Hybrid", "HybridState", "HybridStore"]
