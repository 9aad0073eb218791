"""The Paged-Context-Protocol: pure data and rules, no I/O.

What a host calls, in the order a request meets it (``request`` tells the walk):
read the messages as a ``Conversation``; measure them (``prompt_tokens``) and
ask the Sentry (``engaged``); look the session up in the host's store (a
``Resolution``); ``prepare`` the request; drive its ``rounds``, fulfilling their
effects (``Similarity``, ``CallRouter``, ``CallWorker``, answered by a
``WorkerReply``); let an ``AnswerGate`` decide what of a streamed round reaches
the client; ``solidified_session`` is the session the store keeps. A session's PACT
components (``pact``: a ``Tree``) are advanced ``on_request`` and placed
``with_components`` in protocol mode, ``onto_messages`` below the threshold.
"""

from .compaction import COMPACTION_PROMPTS, asks_to_compact, compaction_text, marked_handles
from .context_edits import Compaction, Edited, EditError, after_compaction, apply_edits, edits_of, stored_pages
from .conversation import Conversation, attached, fold_system, message_text, part_handle
from .directives.answers import NO_ANSWER, AnswerGate, spoken
from .directives.replies import WorkerReply, calls_client_tool
from .effects import CallRouter, CallWorker, Effect, LoadPages, Outcome, Similarity
from .exchanges import Call, Part, Result, Said, chat_messages, text_part
from .pact.placement import onto_messages, placement
from .pact.tree import ComponentSpec, PactError, Tree, conversation_links, delete, insert, node, on_request, parse_selector, select, snapshot
from .pages.blocks import ScanPolicy
from .pages.logical import ConsolidatedPage, OriginalPage, Page, View, short_hash
from .pages.summaries import model_summary, summary_prompt
from .paging.history import PagedHistory, PagingPolicy
from .prompt.synthesis_types import Step, Synthesis
from .ranking.bm25 import Bm25Cache
from .request import (
    Facts,
    Paged,
    Policy,
    Prepared,
    Resolution,
    asked,
    engaged,
    head_tokens,
    pageable,
    prepare,
    question_links,
    rounds,
    solidified_session,
    with_appendix,
    with_cached_frame,
    with_components,
    with_frame,
    within_conversation,
    within_window,
)
from .round_policy import RoundPolicy
from .session import (
    SESSION_ID,
    Session,
    begins_with,
    branch_id,
    branch_probes,
    chain_links,
    client_named,
    common_prefix,
    departs,
    identity,
    links_continuing,
    longest_extended,
    new_session_id,
    parted_id,
    reconciled,
    transcript,
)
from .text.tokens import Checkpoint, CountText, part_text, prompt_tokens

__all__ = [
    "COMPACTION_PROMPTS",
    "asks_to_compact",
    "compaction_text",
    "marked_handles",
    "NO_ANSWER",
    "SESSION_ID",
    "AnswerGate",
    "Bm25Cache",
    "Call",
    "CallRouter",
    "CallWorker",
    "Checkpoint",
    "ComponentSpec",
    "ConsolidatedPage",
    "Compaction",
    "Conversation",
    "CountText",
    "EditError",
    "Edited",
    "Effect",
    "Facts",
    "LoadPages",
    "OriginalPage",
    "Outcome",
    "PactError",
    "Page",
    "Paged",
    "PagedHistory",
    "PagingPolicy",
    "Part",
    "Policy",
    "Prepared",
    "Resolution",
    "Result",
    "RoundPolicy",
    "Said",
    "ScanPolicy",
    "Session",
    "Similarity",
    "Step",
    "Synthesis",
    "Tree",
    "View",
    "WorkerReply",
    "after_compaction",
    "apply_edits",
    "asked",
    "attached",
    "begins_with",
    "branch_id",
    "branch_probes",
    "calls_client_tool",
    "chain_links",
    "chat_messages",
    "client_named",
    "common_prefix",
    "conversation_links",
    "delete",
    "departs",
    "edits_of",
    "engaged",
    "head_tokens",
    "fold_system",
    "identity",
    "insert",
    "links_continuing",
    "longest_extended",
    "message_text",
    "model_summary",
    "new_session_id",
    "node",
    "on_request",
    "onto_messages",
    "pageable",
    "parse_selector",
    "parted_id",
    "part_handle",
    "part_text",
    "placement",
    "prepare",
    "prompt_tokens",
    "question_links",
    "reconciled",
    "with_cached_frame",
    "with_frame",
    "rounds",
    "select",
    "solidified_session",
    "short_hash",
    "snapshot",
    "spoken",
    "stored_pages",
    "summary_prompt",
    "text_part",
    "transcript",
    "with_appendix",
    "with_components",
    "within_conversation",
    "within_window",
]
