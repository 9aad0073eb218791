"""P-Mem: memory that outlives the conversation, as rules (no I/O).

Memory holds the same pages as a conversation's context (``pcp_core.pages.logical``),
with ``origin`` Storage: ``kept`` says how a conversation's pages are kept,
``selection`` how they are chosen for a request, ``consolidator`` how they are
tidied in the background. The host keeps them, indexes them, and runs both.
"""

from .consolidator import ConsolidatorPolicy, Root, horizontal_merges
from .fading import MemoryUse, Metabolism, decay, fade, memory_use, rise, vitality
from .kept import (
    MEMORY_ID_LENGTH,
    container_id,
    conversation_pages,
    index_terms,
    memory_pages,
    page_turns,
    rebuilt,
    turn_hash,
    turn_hashes,
    vector_text,
    without_turns,
)
from .novelty import MemoryIntake, asks, content_terms, novelty, repeats
from .selection import Candidate, MemoryPolicy, index_weights, memory_intent, ranked, recalled_order, selection

__all__ = [
    "MEMORY_ID_LENGTH",
    "Candidate",
    "ConsolidatorPolicy",
    "MemoryIntake",
    "MemoryPolicy",
    "MemoryUse",
    "Metabolism",
    "Root",
    "asks",
    "container_id",
    "content_terms",
    "conversation_pages",
    "decay",
    "fade",
    "index_weights",
    "horizontal_merges",
    "index_terms",
    "memory_intent",
    "memory_pages",
    "memory_use",
    "novelty",
    "page_turns",
    "ranked",
    "rebuilt",
    "recalled_order",
    "repeats",
    "rise",
    "selection",
    "turn_hash",
    "turn_hashes",
    "vector_text",
    "vitality",
    "without_turns",
]
