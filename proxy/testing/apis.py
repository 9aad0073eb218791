"""Scripted answers of the Responses API and of Anthropic's Messages API, for ``proxy.testing.upstream.FakeUpstream``.

As ``completion`` and ``stream_reply`` script a chat completion, these script
the other two APIs, whole or as their event streams::

    upstream.enqueue(response("hello"), responses_stream(["hel", "lo"]))
    upstream.enqueue(message("hello", tool_uses=[("get_weather", {"city": "Paris"})]))
    api_requests(upstream, "messages", role="worker")[-1].json["system"]

A fake upstream with nothing scripted answers each API in its own shape (``default_reply``).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from pcp_core.prompt.document import paged_context
from pcp_core.prompt.frame import prompt_text

from ..headers import ROLE
from .replies import Recorded, Reply, completion, stream_reply

__all__ = [
    "answer",
    "api_of",
    "api_requests",
    "default_reply",
    "document_of",
    "message",
    "messages_stream",
    "response",
    "responses_stream",
    "worker_document",
    "worker_text",
]

_ids = itertools.count(1)
Calls = Sequence[tuple[str, Any]]  # (name, arguments: a JSON string or an object)
PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}


def api_requests(fake: Any, api: str, role: str | None = None) -> list[Recorded]:
    """The calls ``fake`` got of one API ("chat", "responses", "messages"), of one ``x-pcp-role`` if given."""
    return [r for r in fake.requests if r.path.endswith(PATHS[api]) and (role is None or r.headers.get(ROLE) == role)]


def api_of(recorded: Recorded) -> str:
    """Which API a call is of, by its path."""
    return next((api for api, path in PATHS.items() if recorded.path.endswith(path)), "chat")


def answer(api: str, text: str, *, stream: bool = False, input_tokens: int = 10, output_tokens: int = 2) -> Reply:
    """An answer that says ``text``, in ``api``'s shape (streamed: its events)."""
    if api == "responses":
        return (
            responses_stream([text], input_tokens=input_tokens, output_tokens=output_tokens)
            if stream
            else response(text, input_tokens=input_tokens, output_tokens=output_tokens)
        )
    if api == "messages":
        return (
            messages_stream([text], input_tokens=input_tokens, output_tokens=output_tokens)
            if stream
            else message(text, input_tokens=input_tokens, output_tokens=output_tokens)
        )
    usage = {"prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}
    return stream_reply([text], usage=usage) if stream else completion(text, prompt_tokens=input_tokens, completion_tokens=output_tokens)


def default_reply(recorded: Recorded) -> Reply:
    """ "ok" in the shape of the API called."""
    return answer(api_of(recorded), "ok", stream=_streams(recorded))


def worker_document(recorded: Recorded) -> str:
    """The ``<PagedContext>`` of a worker call, from its user message (chat, Messages: the last message, whose
    text the proxy may have cut into blocks; Responses: the last ``input`` item)."""
    return paged_context(worker_text(recorded))


def document_of(messages: Sequence[dict[str, Any]]) -> str:
    """The ``<PagedContext>`` of a worker prompt's chat messages."""
    return paged_context(prompt_text(messages))


def worker_text(recorded: Recorded) -> str:
    """The text of a worker call's user message: the client's first message, the document, the user line."""
    body = recorded.json
    conversation = body["input"] if api_of(recorded) == "responses" else body["messages"]
    content = conversation[-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") in ("text", "input_text"))


def _streams(recorded: Recorded) -> bool:
    """Whether the recorded call asked for a stream."""
    try:
        return bool(recorded.json.get("stream"))
    except (ValueError, AttributeError):
        return False


def _json(reply: dict[str, Any], headers: dict[str, str] | None) -> Reply:
    """A reply of one JSON body."""
    return Reply(body=json.dumps(reply).encode(), headers={"content-type": "application/json", **(headers or {})})


def _sse(events: Iterable[dict[str, Any]], headers: dict[str, str] | None) -> Reply:
    """A reply of named server-sent events."""
    chunks = [f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events]
    return Reply(headers={"content-type": "text/event-stream", **(headers or {})}, chunks=list(chunks))


def _arguments(arguments: Any) -> str:
    """Arguments as JSON text."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


# -- the Responses API -------------------------------------------------------------------


def _response(output: list[dict[str, Any]], model: str, status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    """A fake response object with ``output``."""
    return {
        "id": f"resp_fake{next(_ids)}", "object": "response", "created_at": int(time.time()), "status": status, "model": model,
        "output": output, "usage": usage, "instructions": None, "tools": [], "tool_choice": "auto", "parallel_tool_calls": True,
        "error": None, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "metadata": {}, "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}},
    }  # fmt: skip


def _responses_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """A response's usage with these counts."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _output(text: str | None, function_calls: Calls, reasoning: bool, custom_calls: Calls = ()) -> list[dict[str, Any]]:
    """A fake response's output items: reasoning, a message, function and custom tool calls."""
    n = next(_ids)
    output: list[dict[str, Any]] = [{"id": f"rs_fake{n}", "type": "reasoning", "summary": []}] if reasoning else []
    if text is not None:
        output.append(
            {
                "id": f"msg_fake{n}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for i, (name, arguments) in enumerate(function_calls):
        output.append(
            {
                "id": f"fc_fake{n}_{i}",
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_fake{n}_{i}",
                "name": name,
                "arguments": _arguments(arguments),
            }
        )
    for i, (name, text) in enumerate(custom_calls):  # a custom (freeform) tool's call: its input is text
        output.append(
            {"id": f"ctc_fake{n}_{i}", "type": "custom_tool_call", "status": "completed", "call_id": f"call_fakec{n}_{i}", "name": name, "input": text}
        )
    return output


def response(
    text: str | None = "ok",
    *,
    function_calls: Calls = (),
    custom_calls: Calls = (),
    reasoning: bool = False,
    model: str = "fake-model",
    input_tokens: int = 10,
    output_tokens: int = 2,
    status: str = "completed",
    headers: dict[str, str] | None = None,
) -> Reply:
    """A response object: (a reasoning item,) a message saying ``text`` unless it is None, a function call per
    ``function_calls``, a custom tool's call per ``custom_calls`` (name, input text)."""
    output = _output(text, function_calls, reasoning, custom_calls)
    return _json(_response(output, model, status, _responses_usage(input_tokens, output_tokens)), headers)


def responses_stream(
    pieces: Iterable[str] | None,
    *,
    function_calls: Calls = (),
    custom_calls: Calls = (),
    model: str = "fake-model",
    input_tokens: int = 10,
    output_tokens: int = 2,
    status: str = "completed",
    headers: dict[str, str] | None = None,
) -> Reply:
    """The events of a streamed response that says ``pieces`` in order (none: no message) and makes ``function_calls`` and ``custom_calls``."""
    pieces = list(pieces) if pieces is not None else None
    output = _output("".join(pieces) if pieces is not None else None, function_calls, False, custom_calls)
    final = _response(output, model, status, _responses_usage(input_tokens, output_tokens))
    events: list[dict[str, Any]] = [{"type": "response.created", "response": {**final, "status": "in_progress", "output": [], "usage": None}}]
    for index, item in enumerate(output):
        events += _item_events(index, item, pieces or [])
    events.append({"type": f"response.{status}", "response": final})
    return _sse(({**event, "sequence_number": n} for n, event in enumerate(events)), headers)


def _item_events(index: int, item: dict[str, Any], pieces: list[str]) -> list[dict[str, Any]]:
    """One output item as its stream's events, its text or arguments in ``pieces``."""
    if item["type"] == "custom_tool_call":
        at = {"output_index": index, "item_id": item["id"]}
        return [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "input": ""}},
            {"type": "response.custom_tool_call_input.delta", **at, "delta": item["input"]},
            {"type": "response.custom_tool_call_input.done", **at, "input": item["input"]},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    if item["type"] == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
        return [
            {"type": "response.output_item.added", "output_index": index, "item": added},
            {"type": "response.function_call_arguments.delta", "output_index": index, "item_id": item["id"], "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", "output_index": index, "item_id": item["id"], "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    at = {"item_id": item["id"], "output_index": index, "content_index": 0}
    part = item["content"][0]
    return [
        {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        *({"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []} for piece in pieces),
        {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


# -- Anthropic's Messages API ------------------------------------------------------------


def _content(text: str | None, tool_uses: Calls, thinking: bool) -> list[dict[str, Any]]:
    """A fake message's content blocks: thinking, text and tool uses."""
    n = next(_ids)
    content: list[dict[str, Any]] = [{"type": "thinking", "thinking": "Let me see.", "signature": f"sig{n}"}] if thinking else []
    if text is not None:
        content.append({"type": "text", "text": text})
    for i, (name, arguments) in enumerate(tool_uses):
        content.append({"type": "tool_use", "id": f"toolu_fake{n}_{i}", "name": name, "input": json.loads(_arguments(arguments))})
    return content


def _message(content: list[dict[str, Any]], model: str, stop_reason: str | None, usage: dict[str, int]) -> dict[str, Any]:
    """A fake message with ``content``."""
    return {
        "id": f"msg_fake{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def message(
    text: str | None = "ok",
    *,
    tool_uses: Calls = (),
    thinking: bool = False,
    model: str = "fake-claude",
    input_tokens: int = 10,
    output_tokens: int = 2,
    cache_read: int = 0,
    stop_reason: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """A message: (a thinking block,) a text block saying ``text`` unless it is None, a tool_use block per ``tool_uses``."""
    usage = {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cache_read}
    stop = stop_reason or ("tool_use" if tool_uses else "end_turn")
    return _json(_message(_content(text, tool_uses, thinking), model, stop, usage), headers)


def messages_stream(
    pieces: Iterable[str] | None,
    *,
    tool_uses: Calls = (),
    thinking: bool = False,
    model: str = "fake-claude",
    input_tokens: int = 10,
    output_tokens: int = 2,
    stop_reason: str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """The events of a streamed message that says ``pieces`` in order (none: no text block) and makes ``tool_uses``."""
    pieces = list(pieces) if pieces is not None else None
    content = _content("".join(pieces) if pieces is not None else None, tool_uses, thinking)
    stop = stop_reason or ("tool_use" if tool_uses else "end_turn")
    start = _message([], model, None, {"input_tokens": input_tokens, "output_tokens": 1})  # a stream's start has no stop_reason yet
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}, {"type": "ping"}]
    for index, block in enumerate(content):
        events += _block_events(index, block, pieces or [])
    events += [
        {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": output_tokens}},
        {"type": "message_stop"},
    ]
    return _sse(events, headers)


def _block_events(index: int, block: dict[str, Any], pieces: list[str]) -> list[dict[str, Any]]:
    """One content block as its stream's events, its text in ``pieces``."""
    kind = block["type"]
    if kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}, {"type": "signature_delta", "signature": block["signature"]}]
        started: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
    elif kind == "tool_use":
        arguments = json.dumps(block["input"])
        half = len(arguments) // 2
        deltas = [{"type": "input_json_delta", "partial_json": part} for part in (arguments[:half], arguments[half:])]
        started = {**block, "input": {}}
    else:
        deltas = [{"type": "text_delta", "text": piece} for piece in pieces]
        started = {"type": "text", "text": ""}
    return [
        {"type": "content_block_start", "index": index, "content_block": started},
        *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
        {"type": "content_block_stop", "index": index},
    ]
