"""The Paged-Context-Protocol: pure data and rules, no I/O.

What a host calls, in the order a request meets it (``request`` tells the walk):
read the messages as a ``Conversation``; measure them (``prompt_tokens``) and
ask the Sentry (``engaged``); look the session up in the host's store (a
``Resolution``); ``prepare`` the request; drive its ``rounds``, fulfilling their
effects (``Similarity``, ``CallRouter``, ``CallWorker``, answered by a
``WorkerReply``); let an ``AnswerGate`` decide what of a streamed round reaches
the client; ``settle`` the session the store keeps.
"""

from .answers import NO_ANSWER, AnswerGate, spoken
from .bm25 import Bm25Cache
from .conversation import Conversation, message_text
from .engine import CallRouter, CallWorker, Effect, Outcome, RoundPolicy, Similarity
from .pages import ConsolidatedPage, OriginalPage, Page, short_hash
from .paging import PagedHistory, PagingPolicy
from .pblock import Scan
from .replies import WorkerReply, calls_client_tool
from .request import Facts, Paged, Policy, Prepared, Resolution, asked, engaged, prepare, remembered, rounds, settle
from .session import SESSION_ID, Session, begins_with, chain_links, common_prefix, transcript
from .summaries import model_summary, summary_prompt
from .tokens import CountText, prompt_tokens

__all__ = [
    "NO_ANSWER",
    "SESSION_ID",
    "AnswerGate",
    "Bm25Cache",
    "CallRouter",
    "CallWorker",
    "ConsolidatedPage",
    "Conversation",
    "CountText",
    "Effect",
    "Facts",
    "OriginalPage",
    "Outcome",
    "Page",
    "Paged",
    "PagedHistory",
    "PagingPolicy",
    "Policy",
    "Prepared",
    "Resolution",
    "RoundPolicy",
    "Scan",
    "Session",
    "Similarity",
    "WorkerReply",
    "asked",
    "begins_with",
    "calls_client_tool",
    "chain_links",
    "common_prefix",
    "engaged",
    "message_text",
    "model_summary",
    "prepare",
    "prompt_tokens",
    "remembered",
    "rounds",
    "settle",
    "short_hash",
    "spoken",
    "summary_prompt",
    "transcript",
]
