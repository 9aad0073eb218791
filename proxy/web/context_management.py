"""The providers' context management, served by the proxy where the upstream does not: lossless, by paging.

Anthropic's ``context_management`` (``pcp_core.context_edits``) on a Messages
request, where the Messages API has no upstream of its own
(``PCP_ANTHROPIC_BASE_URL``) and is translated to chat completions (or always,
with ``PCP_SERVE_CONTEXT_MANAGEMENT``):

* a clearing edit that fires (``clear_tool_uses_*``, ``clear_thinking_*``) runs
  the request in protocol mode on its whole history, so that what it clears is
  paged in its session, which the model can Consult; what goes upstream is no
  larger than the request its edits leave (the budget, on top of the head every
  call carries whole, is narrowed to what it takes beside that head). The
  answer reports ``context_management.applied_edits`` as Anthropic's does.
* ``compact_20260112`` over its trigger runs the request in protocol mode too,
  and hands back one ``compaction`` block first in the answer: the proxy's handle
  (signed with the install's secret, bound to the caller's namespace:
  ``Namespaces.handle``) to the session's pages.
* a request that carries such a block is read from the block on (what is before
  it is dropped, as Anthropic drops it) and runs in protocol mode with the pages
  the handle stands for behind its own.

OpenAI's ``POST /v1/responses/compact`` (``compacted``), where the upstream lacks
it: the input's history is paged into a session (no model call) and the answer's
output is the input's user messages and exactly one ``compaction`` item, whose
``encrypted_content`` is the handle to the session's pages (and to those of a
compaction item the input carried). A later ``/v1/responses`` request that carries
such an item (``responses_plan``) runs in protocol mode with those pages behind it.

Where protocol mode cannot take the request (``x-pcp-mode-request: off``, a
budget its query and attachments alone fill), the edited request goes upstream as Anthropic
would send it to the model: cleared, and not reported.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pcp_core import Conversation, EditError, after_compaction, apply_edits, edits_of, short_hash

from ..apis.messages import Managed
from ..apis.responses import RESPONSES
from ..errors import ClientError
from ..protocol.control import Control
from ..protocol.drive import keep_pages
from ..services import Services
from ..storage.datadir import HANDLE_PREFIX

__all__ = ["Plan", "compacted", "plan", "responses_plan", "serves_context_management"]

COMPACT_PATH = "/responses/compact"
Read = Callable[[bytes], tuple[Any, int, int, int]]  # a body's reading, its messages' tokens, its prompt's and its head's


@dataclass
class Plan:
    """How a Messages request whose context the proxy manages is served."""

    body: bytes  # the request as it is read and paged from here: its whole history (from its compaction on), no edits
    read: tuple[Any, int, int, int]  # ``body`` read: its ``Reading``, its messages' tokens, its prompt's, its head's
    forwarded: bytes  # the request as its edits leave it: what goes upstream where it is not paged
    managed: Managed
    budget: int | None = None  # what the request its edits leave takes beside its head (carried on top): no more goes upstream
    behind: list[str] = field(default_factory=list)  # sessions of the caller whose pages it reads beside its own

    @property
    def forced(self) -> bool:
        """Whether the request must be paged: an edit fired, or it carries pages behind it."""
        return bool(self.managed.applied or self.managed.compaction is not None or self.behind)

    def controlled(self, control: Control) -> Control:
        """``control`` in protocol mode, its budget no larger than what the edited request takes."""
        policy = control.policy
        if self.budget is not None and self.budget < policy.rounds.budget:
            policy = policy.with_rounds(budget=self.budget)
        return msgspec.structs.replace(control, mode="force", policy=policy)


def serves_context_management(services: Services) -> bool:
    """Whether the proxy applies a Messages request's context management: where the upstream that takes it does not
    speak Messages (translated to chat completions), or the settings say it always does."""
    settings = services.settings
    return settings.serve_context_management or (services.anthropic is None and settings.translate_apis != "never")


def plan(services: Services, namespace: str, body: bytes, read: Read) -> Plan | None:
    """How the Messages request ``body`` is served when it carries context management or a compaction block; None:
    as any other (nothing asked, or nothing fired)."""
    if b'"context_management"' not in body and b'"compaction"' not in body:
        return None
    try:
        asked = json.loads(body)
    except ValueError:
        return None  # the reading says what is wrong with it
    if not isinstance(asked, dict) or not isinstance(asked.get("messages"), list):
        return None
    try:
        edits = edits_of(asked.get("context_management"))
    except EditError as error:
        raise ClientError(str(error), param=error.param) from None
    held, messages = after_compaction(asked["messages"])
    behind: list[str] = []
    if held is not None and held.startswith(HANDLE_PREFIX):
        behind = _opened(services, namespace, held, "block", "messages")
    elif held is not None:  # another's compaction (Anthropic's summary): its text stands for what it compacted
        messages = [{"role": "user", "content": [{"type": "text", "text": held}]}, *messages]
    whole = {k: v for k, v in asked.items() if k != "context_management"}
    whole["messages"] = messages
    body = json.dumps(whole).encode()
    reading = read(body)
    count = services.tokenizer.count
    edited = apply_edits(messages, edits, reading[2], count)
    if not (edited.applied or edited.compaction is not None or behind):
        return None
    forwarded = json.dumps({**whole, "messages": edited.messages}).encode()
    budget = None
    if edited.applied:
        _, _, tokens, carried = read(forwarded)
        budget = tokens - carried
    managed = Managed(edited.applied, edited.compaction, lambda sessions: services.namespaces.handle(namespace, sessions))
    return Plan(body, reading, forwarded, managed, budget, behind)


# -- OpenAI's Responses: /responses/compact, and the compaction items a request carries -------------------------


def _opened_items(services: Services, namespace: str, items: list[Any]) -> tuple[list[Any], list[str]] | None:
    """``items`` without the compaction items this proxy made, and the sessions those stand for; None: there are none."""
    ours = [i for i, item in enumerate(items) if _our_compaction(item)]
    if not ours:
        return None
    behind: list[str] = []
    for i in ours:
        opened = _opened(services, namespace, items[i]["encrypted_content"], "item", f"input.[{i}]")
        behind.extend(s for s in opened if s not in behind)
    return [item for i, item in enumerate(items) if i not in ours], behind


def _opened(services: Services, namespace: str, handle: str, what: str, param: str) -> list[str]:
    """The sessions a compaction ``what`` (block, item) this proxy made for the caller stands for, or the 400 that says it did not."""
    opened = services.namespaces.opened(namespace, handle)
    if opened is None:
        raise ClientError(
            f"the compaction {what} was not made by this proxy for this caller: its pages cannot be read (send the history it stands for instead)",
            param=param,
            code="invalid_compaction",
        )
    return opened


def _our_compaction(item: Any) -> bool:
    """Whether ``item`` is a compaction item this proxy made (its content one of the proxy's handles)."""
    return isinstance(item, dict) and item.get("type") == "compaction" and str(item.get("encrypted_content") or "").startswith(HANDLE_PREFIX)


def responses_plan(services: Services, namespace: str, body: bytes) -> tuple[bytes, list[str]] | None:
    """A Responses request that carries compaction items this proxy made: its body without them, and the sessions
    whose pages it reads beside its own; None for any other (an upstream's own compaction items go to it)."""
    if b'"compaction"' not in body:
        return None
    try:
        asked = json.loads(body)
    except ValueError:
        return None
    if not isinstance(asked, dict) or not isinstance(asked.get("input"), list):
        return None
    opened = _opened_items(services, namespace, asked["input"])
    if opened is None:
        return None
    items, behind = opened
    return json.dumps({**asked, "input": items}).encode(), behind


async def compacted(services: Services, namespace: str, headers: dict[str, str], body: bytes) -> tuple[dict[str, Any], str]:
    """``POST /responses/compact`` served by the proxy: the compacted response, and the session its pages are kept in."""
    try:
        asked = json.loads(body)
    except ValueError:
        raise ClientError("the request body is not JSON", code="invalid_json") from None
    if not isinstance(asked, dict):
        raise ClientError("the request body is not a JSON object", code="invalid_json")
    if asked.get("previous_response_id"):
        raise ClientError(
            "previous_response_id cannot be compacted here: the upstream keeps no responses for the proxy to read (send the input whole)",
            param="previous_response_id",
        )
    given = asked.get("input") or []
    items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given
    if not isinstance(items, list):
        raise ClientError("input is neither text nor a list of items", param="input")
    opened = _opened_items(services, namespace, items)
    items, behind = opened if opened is not None else (items, [])
    # Every item is history: the line after them is only the query a conversation needs.
    paged = {"model": asked.get("model"), "instructions": asked.get("instructions"), "input": [*items, {"role": "user", "content": "(compacted)"}]}
    reading = RESPONSES.read(json.dumps(paged).encode())
    control = services.controls.of(headers, reading.model)
    conversation = Conversation.of(reading.messages, control.policy.paging.blocks, services.tokenizer.count)
    sessions = list(behind)
    session_id = ""
    if conversation.history:
        session_id = await keep_pages(services, RESPONSES.codec(paged), conversation, headers, namespace, control.policy)
        sessions.insert(0, session_id)
    users = [_user_item(item) for item in items if isinstance(item, dict) and item.get("role") == "user" and item.get("type") in (None, "message")]
    compaction = {
        "id": f"cmp_pcp{short_hash(f'{namespace}{time.time_ns()}')}",
        "type": "compaction",
        "encrypted_content": services.namespaces.handle(namespace, sessions),
    }
    response = {
        "id": f"resp_pcp{short_hash(f'compact{time.time_ns()}')}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*users, compaction],
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }
    return response, session_id


def _user_item(item: dict[str, Any]) -> dict[str, Any]:
    """A user message of the input as an item of the compacted output."""
    content = item.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {"type": "message", "role": "user", "content": parts}
