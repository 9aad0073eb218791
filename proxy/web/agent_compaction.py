"""An agent's own compaction, answered from the pages (``pcp_core.compaction``), in the API it was asked in.

The history is paged into a session and kept, with no model call; the answer
is the text ``compaction_text`` makes, as the API's whole answer or its event
stream. A later request that carries the text's marker (``marked_behind``)
reads those pages beside its own.
"""

from __future__ import annotations

import json
import time
from typing import Any

from litestar import Response

from pcp_core import COMPACTION_PROMPTS, Conversation, Policy, compaction_text, marked_handles, short_hash
from pcp_core.compaction import PAGES_MARKER

from .. import headers as pcp
from ..apis.codec import Api, Codec
from ..apis.messages.chat_answer import message_of
from ..apis.responses.chat_answer import response_of
from ..protocol.drive import keep_pages
from ..services import Services

__all__ = ["COMPACTING", "answered", "marked_behind"]

# What a body holds when it may be an agent's compaction (``pcp_core.COMPACTION_PROMPTS``), or carry the marker of one
# answered here: a look at the bytes before anything is decoded, so that no other request pays for either.
COMPACTING = tuple(prompt.encode() for prompt in COMPACTION_PROMPTS)
MARKED = PAGES_MARKER.partition("{")[0].encode()
# The client's API's whole answer, from a chat completion.
_WHOLE = {"messages": message_of, "responses": response_of}


async def answered(
    services: Services,
    api: Api,
    codec: Codec,
    conversation: Conversation,
    asked: dict[str, Any],
    headers: dict[str, str],
    namespace: str,
    policy: Policy,
    behind: list[str],
) -> Response[Any]:
    """The compaction ``asked`` for: its history kept as a session's pages, and the text that hands them on (and the
    pages ``behind`` it: the compactions it carries the markers of), as ``api`` answers."""
    session_id = await keep_pages(services, codec, conversation, headers, namespace, policy)
    handle = services.namespaces.handle(namespace, [session_id, *[s for s in behind if s != session_id]])
    text = compaction_text(conversation, handle, services.tokenizer.count)
    written = services.tokenizer.count(text)
    model = str(asked.get("model") or "")
    completion = {
        "id": f"chatcmpl-pcp{short_hash(f'{namespace}{time.time_ns()}')}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": written, "total_tokens": written},
    }
    whole = _WHOLE[api.name](completion, asked) if api.name in _WHOLE else completion
    content = json.dumps(whole).encode()
    answer_headers = {pcp.MODE: "protocol", pcp.MODE_REASON: "agent-compaction", pcp.SESSION: session_id}
    services.metrics.inc("pcp_requests_total", mode="protocol")
    if asked.get("stream") and api.as_stream is not None:
        return Response(api.as_stream(content), headers=answer_headers, media_type="text/event-stream")
    return Response(content, headers=answer_headers, media_type="application/json")


def marked_behind(services: Services, namespace: str, body: bytes) -> list[str]:
    """The sessions whose pages the compactions answered here for this caller left marked in ``body``. A marker this
    proxy did not make for the caller (a pasted one, another's) opens nothing: it is text like any other."""
    if MARKED not in body:
        return []
    sessions: list[str] = []
    for handle in marked_handles(body.decode("utf-8", "replace")):
        for session in services.namespaces.opened(namespace, handle) or ():
            if session not in sessions:
                sessions.append(session)
    return sessions
