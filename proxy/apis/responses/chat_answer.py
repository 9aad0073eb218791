"""OpenAI's Responses API over an upstream that speaks only chat completions: the answer back.

``response_of`` writes a chat completion as a response object, ``ChatEvents`` a chat
stream as the events of a response, ``error_body`` an upstream's error in
OpenAI's envelope.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pcp_core import short_hash

from ...decoding import strict_json
from ..chat.chunks import error_of, first_deltas
from ..codec import text_of
from .wire import ResponseStream, message_item

__all__ = ["ChatEvents", "error_body", "response_of", "response_usage"]

Item = dict[str, Any]


def response_usage(chat_usage: Any) -> dict[str, Any]:
    """A chat completion's usage as a response's."""
    counts = chat_usage if isinstance(chat_usage, dict) else {}
    details = counts.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt, completion = int(counts.get("prompt_tokens") or 0), int(counts.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": int(cached or 0)},
        "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(counts.get("total_tokens") or prompt + completion),
    }  # fmt: skip


def _id(prefix: str) -> str:
    """A new id with ``prefix``, as OpenAI's look."""
    return f"{prefix}_{short_hash(f'{prefix}{time.time_ns()}')}"


def _custom(asked: dict[str, Any]) -> set[str]:
    """The names of the request's custom tools: their calls go back as custom tool calls."""
    return {tool["name"] for tool in asked.get("tools") or () if isinstance(tool, dict) and tool.get("type") == "custom" and isinstance(tool.get("name"), str)}


def _call(item_id: str, call_id: str, name: str, arguments: str, custom: bool, status: str = "completed") -> Item:
    """A chat tool call as a Responses output item: a function call, or a custom tool's call with its free-form input."""
    if not custom:
        return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}
    try:
        parsed = strict_json(arguments)
    except (ValueError, RecursionError):
        parsed = None
    free = parsed.get("input") if isinstance(parsed, dict) else None
    return {
        "id": item_id,
        "type": "custom_tool_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "input": text_of(free if free is not None else arguments),
    }


def _response(asked: dict[str, Any], meta: dict[str, Any], status: str, output: list[Item], usage: Any) -> dict[str, Any]:
    """A response object that answers ``asked``, with its ``output`` and usage."""
    return {
        "id": meta["id"], "object": "response", "created_at": meta["created"], "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": asked.get("instructions"), "max_output_tokens": asked.get("max_output_tokens"), "model": meta["model"],
        "output": output, "parallel_tool_calls": asked.get("parallel_tool_calls", True), "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": bool(asked.get("store", False)), "temperature": asked.get("temperature", 1.0),
        "text": asked.get("text") or {"format": {"type": "text"}}, "tool_choice": asked.get("tool_choice", "auto"),
        "tools": asked.get("tools") or [], "top_p": asked.get("top_p", 1.0), "truncation": "disabled",
        "usage": usage, "user": asked.get("user"), "metadata": asked.get("metadata") or {},
    }  # fmt: skip


def _status(finish_reason: Any) -> str:
    """Chat's finish reason as a response's status."""
    return "incomplete" if finish_reason in ("length", "content_filter") else "completed"


def response_of(completion: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as the response object that answers ``asked``."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[Item] = []
    if message.get("content"):
        output.append(message_item(_id("msg"), text_of(message["content"])))
    custom = _custom(asked)
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        output.append(_call(_id("fc"), str(call.get("id") or _id("call")), name, text_of(function.get("arguments")), name in custom))
    meta = {"id": _id("resp"), "created": completion.get("created") or int(time.time()), "model": completion.get("model") or asked.get("model") or ""}
    return _response(asked, meta, _status(choice.get("finish_reason")), output, response_usage(completion.get("usage")))


def error_body(status: int, body: bytes) -> bytes:
    """An upstream's error as OpenAI's envelope (the Responses API's too), its message kept."""
    error = error_of(body)
    kind = error.get("type") if isinstance(error.get("type"), str) else "invalid_request_error" if status < 500 else "server_error"
    code = error.get("code") if isinstance(error.get("code"), str) else None
    param = error.get("param") if isinstance(error.get("param"), str) else None
    return json.dumps({"error": {"message": _message_of(error, status), "type": kind, "param": param, "code": code}}).encode()


def _message_of(error: dict[str, Any], status: int) -> str:
    """An upstream error's message, or what its status says."""
    return str(error.get("message") or f"the upstream answered {status}")[:500]


class ChatEvents:
    """A chat completion's chunks, read as they come, written as a response's events: created, in progress,
    a message item and its text deltas, a function call item per call and its argument deltas, the ``…done``
    events, then ``response.completed`` (``incomplete`` at the length limit) with the usage."""

    def __init__(self, asked: dict[str, Any]):
        self.asked = asked
        self.custom = _custom(asked)
        self.meta: dict[str, Any] = {"id": _id("resp"), "created": int(time.time()), "model": asked.get("model") or ""}
        self.event = ResponseStream()  # the client's events
        self.started = False
        self.text: dict[str, Any] | None = None  # the message item: its output index, id and text so far
        self.calls: dict[int, dict[str, Any]] = {}  # by the chunk's index: output index, item id, call id, name, arguments
        self.outputs = 0
        self.finish_reason: Any = None
        self.usage: Any = None

    def _opening(self) -> bytes:
        """``response.created`` and ``response.in_progress``, once: the first events of the stream."""
        if self.started:
            return b""
        self.started = True
        return self.event.started(_response(self.asked, self.meta, "in_progress", [], None))

    def read(self, chunk: dict[str, Any]) -> bytes:
        """One chat chunk's events."""
        self.meta.update({k: chunk[k] for k in ("model", "created") if chunk.get(k)})
        out = [self._opening()]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for delta, finished in first_deltas(chunk):
            if delta.get("content"):
                out.append(self._text(text_of(delta["content"])))
            for call in delta.get("tool_calls") or ():
                out.append(self._called(call))
            self.finish_reason = finished or self.finish_reason
        return b"".join(out)

    def _text(self, text: str) -> bytes:
        """The events of a piece of text: the message item added where it is the first, then its delta."""
        out = b""
        if self.text is None:
            self.text = {"index": self.outputs, "id": _id("msg"), "text": ""}
            self.outputs += 1
            out = self.event.message_added(self.text["index"], self.text["id"])
        self.text["text"] += text
        return out + self.event.text_delta(self.text["index"], self.text["id"], text)

    def _called(self, delta: dict[str, Any]) -> bytes:
        """The events of a tool call's delta: its item added where it is the first, then its arguments."""
        index = delta.get("index", 0)
        function = delta.get("function") or {}
        call = self.calls.get(index)
        out = b""
        if call is None:
            call = self.calls[index] = {"index": self.outputs, "id": _id("fc"), "call_id": delta.get("id") or _id("call"), "name": "", "arguments": ""}
            self.outputs += 1
            call["name"] = str(function.get("name") or "")
            item = _call(call["id"], call["call_id"], call["name"], "", call["name"] in self.custom, "in_progress")
            out += self.event("response.output_item.added", output_index=call["index"], item=item)
        elif function.get("name"):
            call["name"] += str(function["name"])
        piece = text_of(function.get("arguments"))
        call["arguments"] += piece
        if piece and call["name"] not in self.custom:  # a custom call's input is whole only once its JSON is
            out += self.event("response.function_call_arguments.delta", item_id=call["id"], output_index=call["index"], delta=piece)
        return out

    def closing(self) -> bytes:
        """The events that end the response, once the chat stream has."""
        out = [self._opening()]
        output: list[tuple[int, Item]] = []
        if self.text is not None:
            done, item = self.event.message_done(self.text["index"], self.text["id"], self.text["text"])
            out += done
            output.append((self.text["index"], item))
        for call in self.calls.values():
            item = _call(call["id"], call["call_id"], call["name"], call["arguments"], call["name"] in self.custom)
            if item["type"] == "function_call":
                out.append(self.event("response.function_call_arguments.done", item_id=call["id"], output_index=call["index"], arguments=call["arguments"]))
            out.append(self.event("response.output_item.done", output_index=call["index"], item=item))
            output.append((call["index"], item))
        status = _status(self.finish_reason)
        response = _response(self.asked, self.meta, status, [item for _, item in sorted(output, key=lambda pair: pair[0])], response_usage(self.usage))
        out.append(self.event(f"response.{status}", response=response))
        return b"".join(out)

    def failure(self, message: str, code: str = "upstream_error") -> bytes:
        """An error midway: the stream ends with it, and no ``response.completed``."""
        return self._opening() + self.event("error", code=code, message=message, param=None)
