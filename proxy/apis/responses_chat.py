"""OpenAI's Responses API over an upstream that speaks only chat completions: the request translated, the answer back.

``request`` writes a Responses request as a chat completion's body: the
``instructions`` as a system message, the input items as messages (a function
call joins the assistant turn it belongs to, its output is a ``tool`` message,
reasoning items are left out), function and custom tools as chat functions.
``reply`` writes a chat completion as a response object, ``Round`` a chat
stream as the events of a response, ``failure`` an upstream's error in OpenAI's
envelope. A request that leans on state the upstream would keep
(``previous_response_id``, ``conversation``, a stored ``prompt``,
``background``, an ``item_reference``) cannot be translated: a 400 says so.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pcp_core import short_hash

from ..decoding import strict_json
from ..errors import ClientError
from ..sse import named_event
from .codec import first_deltas, text_of

__all__ = ["Round", "failure", "reply", "request", "said_error", "usage"]

Item = dict[str, Any]
STATEFUL = ("previous_response_id", "conversation", "prompt", "background")
# A custom tool (free-form input) is a chat function of one string argument.
CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
ATTACHED = "_attached"  # marks a user message holding a tool output's attachments, while the messages are written
# Fields that mean the same in both APIs.
SAME = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "top_logprobs", "service_tier", "safety_identifier", "prompt_cache_key")


# What a chat upstream is asked in other words (``request``), or what asks nothing of it: ``include``
# (a chat answer has no reasoning item to include), ``stream_options`` (the proxy writes the events),
# ``truncation: "disabled"`` (chat never truncates).
TRANSLATED = frozenset(
    {"input", "instructions", "max_output_tokens", "tools", "tool_choice", "text", "stream", "stream_options", "reasoning", "include", "truncation"}
    | {"prompt_cache_retention", "store", "metadata"}
)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def refused(asked: dict[str, Any]) -> None:
    """The 400 for a field a chat upstream cannot be asked, named (a null asks nothing)."""
    for field, value in asked.items():
        if value is not None and field not in TRANSLATED and field not in SAME and field not in STATEFUL:
            _refuse(field, f"{field} has no chat-completions form, and this upstream speaks only chat completions")
    if asked.get("truncation") not in (None, "disabled"):
        _refuse("truncation", 'truncation "auto" has no chat-completions form: a chat upstream refuses a prompt longer than its window')
    for i, tool in enumerate(asked.get("tools") or ()):
        if not (isinstance(tool, dict) and tool.get("type") in ("function", "custom")):
            kind = tool.get("type") if isinstance(tool, dict) else tool
            _refuse(f"tools[{i}]", f"the hosted tool {kind!r} cannot run on an upstream that speaks only chat completions: function and custom tools can")
    effort = asked.get("reasoning", {}).get("effort") if isinstance(asked.get("reasoning"), dict) else None
    if effort is not None and effort not in REASONING_EFFORTS:
        _refuse("reasoning.effort", f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}")


def _refuse(param: str, message: str) -> None:
    raise ClientError(message, param=param, code="unsupported_by_upstream")


def request(asked: dict[str, Any]) -> dict[str, Any]:
    """The chat completion's body that asks what ``asked`` (a Responses request) asks."""
    stateful = next((field for field in STATEFUL if asked.get(field)), None)
    items = asked.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else items if isinstance(items, list) else []
    if stateful is None and any(isinstance(item, dict) and item.get("type") == "item_reference" for item in items):
        stateful = "item_reference"
    if stateful is not None:
        raise ClientError(
            f"{stateful} needs state the upstream keeps, and this upstream speaks only chat completions: send the whole conversation as input",
            param=stateful,
            code="unsupported_by_upstream",
        )
    refused(asked)
    messages: list[dict[str, Any]] = [{"role": "system", "content": asked["instructions"]}] if asked.get("instructions") else []
    for item in items:
        if isinstance(item, dict):
            _add(messages, item)
    for message in messages:
        message.pop(ATTACHED, None)
    chat: dict[str, Any] = {k: asked[k] for k in SAME if k in asked}
    chat["messages"] = messages
    if asked.get("store") is not None:  # as chat stores a completion (OpenAI's stored completions; a local server has none)
        chat["store"] = bool(asked["store"])
    if asked.get("metadata"):
        chat["metadata"] = asked["metadata"]
    if asked.get("prompt_cache_retention") is not None:
        chat["prompt_cache_retention"] = asked["prompt_cache_retention"]
    reasoning = asked.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    text = asked.get("text")
    if isinstance(text, dict) and text.get("verbosity") is not None:
        chat["verbosity"] = text["verbosity"]
    if asked.get("max_output_tokens") is not None:
        chat["max_tokens"] = asked["max_output_tokens"]
    tools = [tool for tool in (_tool(t) for t in asked.get("tools") or ()) if tool is not None]
    allowed = _allowed(asked.get("tool_choice"))
    if allowed is not None:  # allowed_tools: the model sees those alone
        tools = [tool for tool in tools if tool["function"]["name"] in allowed]
    if tools:
        chat["tools"] = tools
        if "tool_choice" in asked:
            chat["tool_choice"] = _tool_choice(asked["tool_choice"])
    response_format = _response_format((asked.get("text") or {}).get("format") if isinstance(asked.get("text"), dict) else None)
    if response_format is not None:
        chat["response_format"] = response_format
    if asked.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _add(messages: list[dict[str, Any]], item: Item) -> None:
    kind = item.get("type")
    if kind in (None, "message") and isinstance(item.get("role"), str):
        role = "system" if item["role"] == "developer" else item["role"]
        messages.append({"role": role, "content": _content(item.get("content"))})
    elif kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments") if kind == "function_call" else json.dumps({"input": text_of(item.get("input"))})
        call = {"id": str(item.get("call_id") or ""), "type": "function", "function": {"name": str(item.get("name") or ""), "arguments": text_of(arguments)}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # the calls join the turn that makes them
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        call_id = str(item.get("call_id") or "")
        # A chat tool message holds text alone: the output's images and files follow in a user message, after
        # the tool messages that answer the same turn's calls (chat wants those together).
        at = len(messages)
        while at > 0 and messages[at - 1].get(ATTACHED):
            at -= 1
        messages.insert(at, {"role": "tool", "tool_call_id": call_id, "content": _text_content(item.get("output"))})
        output = item.get("output")
        files = (
            [part for part in (_part(p) for p in output if isinstance(p, dict) and p.get("type") != "input_text") if part is not None]
            if isinstance(output, list)
            else []
        )
        if files:
            messages.append(
                {"role": "user", "content": [{"type": "text", "text": f"(the output of {call_id} holds these attachments)"}, *files], ATTACHED: True}
            )
    # reasoning, and the calls of hosted tools, are the upstream's to keep: a chat upstream has none


def _content(content: Any) -> Any:
    """Input content as chat content: text alone as a string, attachments as chat parts."""
    if not isinstance(content, list):
        return text_of(content)
    parts = [part for part in (_part(p) for p in content if isinstance(p, dict)) if part is not None]
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _part(part: dict[str, Any]) -> dict[str, Any] | None:
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "summary_text"):
        return {"type": "text", "text": text_of(part.get("text"))}
    if kind == "refusal":
        return {"type": "text", "text": text_of(part.get("refusal"))}
    if kind == "input_image":
        url = part.get("image_url") or part.get("file_id")
        return {"type": "image_url", "image_url": {"url": url, **({"detail": part["detail"]} if part.get("detail") else {})}} if url else None
    if kind == "input_file":
        return {"type": "file", "file": {k: part[k] for k in ("file_data", "file_id", "filename") if k in part}}
    if kind == "input_audio":
        return part
    return None


def _text_content(output: Any) -> str:
    if isinstance(output, list):
        return "".join(text_of(part.get("text")) for part in output if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"))
    return text_of(output)


def _tool(tool: Any) -> dict[str, Any] | None:
    """A function (or custom) tool as a chat function; a hosted tool (web_search, …) has none (``refused``)."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        return None
    if tool.get("type") == "function":
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        if tool.get("strict"):
            function["strict"] = True
        return {"type": "function", "function": function}
    if tool.get("type") == "custom":
        description = text_of(tool.get("description"))
        format = tool.get("format")
        if isinstance(format, dict) and format.get("type") == "grammar":  # chat cannot enforce it: the model is told it
            description += f"\n\nThe input follows this {text_of(format.get('syntax'))} grammar:\n{text_of(format.get('definition'))}"
        return {"type": "function", "function": {"name": tool["name"], "description": description.strip(), "parameters": CUSTOM_PARAMETERS}}
    return None


def _allowed(choice: Any) -> set[str] | None:
    """The tools an ``allowed_tools`` choice lets the model call (None: every one)."""
    if not isinstance(choice, dict) or choice.get("type") != "allowed_tools":
        return None
    return {tool["name"] for tool in choice.get("tools") or () if isinstance(tool, dict) and isinstance(tool.get("name"), str)}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, dict) and choice.get("mode") == "required":
        return "required"
    return "auto"


def _response_format(format: Any) -> dict[str, Any] | None:
    if not isinstance(format, dict):
        return None
    if format.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: format[k] for k in ("name", "description", "schema", "strict") if k in format}}
    if format.get("type") == "json_object":
        return {"type": "json_object"}
    return None


# -- the answer ---------------------------------------------------------------------------


def usage(said: Any) -> dict[str, Any]:
    """A chat completion's usage as a response's."""
    said = said if isinstance(said, dict) else {}
    details = said.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt, completion = int(said.get("prompt_tokens") or 0), int(said.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": int(cached or 0)},
        "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(said.get("total_tokens") or prompt + completion),
    }  # fmt: skip


def _id(prefix: str) -> str:
    return f"{prefix}_{short_hash(f'{prefix}{time.time_ns()}')}"


def _custom(asked: dict[str, Any]) -> set[str]:
    """The names of the request's custom tools: their calls go back as custom tool calls."""
    return {tool["name"] for tool in asked.get("tools") or () if isinstance(tool, dict) and tool.get("type") == "custom" and isinstance(tool.get("name"), str)}


def _message(item_id: str, text: str, status: str = "completed") -> Item:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [_output_text(text)]}


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _call(item_id: str, call_id: str, name: str, arguments: str, custom: bool, status: str = "completed") -> Item:
    if not custom:
        return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name, "arguments": arguments}
    try:
        said = strict_json(arguments)
    except (ValueError, RecursionError):
        said = None
    free = said.get("input") if isinstance(said, dict) else None
    return {
        "id": item_id,
        "type": "custom_tool_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "input": text_of(free if free is not None else arguments),
    }


def _response(asked: dict[str, Any], meta: dict[str, Any], status: str, output: list[Item], said_usage: Any) -> dict[str, Any]:
    return {
        "id": meta["id"], "object": "response", "created_at": meta["created"], "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": asked.get("instructions"), "max_output_tokens": asked.get("max_output_tokens"), "model": meta["model"],
        "output": output, "parallel_tool_calls": asked.get("parallel_tool_calls", True), "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": bool(asked.get("store", False)), "temperature": asked.get("temperature", 1.0),
        "text": asked.get("text") or {"format": {"type": "text"}}, "tool_choice": asked.get("tool_choice", "auto"),
        "tools": asked.get("tools") or [], "top_p": asked.get("top_p", 1.0), "truncation": "disabled",
        "usage": said_usage, "user": asked.get("user"), "metadata": asked.get("metadata") or {},
    }  # fmt: skip


def _status(finish_reason: Any) -> str:
    return "incomplete" if finish_reason in ("length", "content_filter") else "completed"


def reply(completion: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as the response object that answers ``asked``."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[Item] = []
    if message.get("content"):
        output.append(_message(_id("msg"), text_of(message["content"])))
    custom = _custom(asked)
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        output.append(_call(_id("fc"), str(call.get("id") or _id("call")), name, text_of(function.get("arguments")), name in custom))
    meta = {"id": _id("resp"), "created": completion.get("created") or int(time.time()), "model": completion.get("model") or asked.get("model") or ""}
    return _response(asked, meta, _status(choice.get("finish_reason")), output, usage(completion.get("usage")))


def failure(status: int, body: bytes) -> bytes:
    """An upstream's error as OpenAI's envelope (the Responses API's too), its message kept."""
    error = said_error(body)
    kind = error.get("type") if isinstance(error.get("type"), str) else "invalid_request_error" if status < 500 else "server_error"
    code = error.get("code") if isinstance(error.get("code"), str) else None
    param = error.get("param") if isinstance(error.get("param"), str) else None
    return json.dumps({"error": {"message": _message_of(error, status), "type": kind, "param": param, "code": code}}).encode()


def said_error(body: bytes) -> dict[str, Any]:
    try:
        said = strict_json(body)
    except (ValueError, RecursionError):
        return {"message": body.decode(errors="replace").strip()[:500]}
    error = said.get("error") if isinstance(said, dict) else None
    return error if isinstance(error, dict) else {"message": str(error or said)[:500]}


def _message_of(error: dict[str, Any], status: int) -> str:
    return str(error.get("message") or f"the upstream answered {status}")[:500]


def event(kind: str, **fields: Any) -> bytes:
    return named_event(kind, {"type": kind, **fields})


# -- a stream ------------------------------------------------------------------------------


class Round:
    """A chat completion's chunks, read as they come, written as a response's events: created, in progress,
    a message item and its text deltas, a function call item per call and its argument deltas, the ``…done``
    events, then ``response.completed`` (``incomplete`` at the length limit) with the usage."""

    def __init__(self, asked: dict[str, Any]):
        self.asked = asked
        self.custom = _custom(asked)
        self.meta: dict[str, Any] = {"id": _id("resp"), "created": int(time.time()), "model": asked.get("model") or ""}
        self.sequence = 0
        self.started = False
        self.text: dict[str, Any] | None = None  # the message item: its output index, id and text so far
        self.calls: dict[int, dict[str, Any]] = {}  # by the chunk's index: output index, item id, call id, name, arguments
        self.outputs = 0
        self.finish_reason: Any = None
        self.usage: Any = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        self.sequence += 1
        return event(kind, sequence_number=self.sequence - 1, **fields)

    def _opening(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        response = _response(self.asked, self.meta, "in_progress", [], None)
        return self._event("response.created", response=response) + self._event("response.in_progress", response=response)

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
        out = b""
        if self.text is None:
            self.text = {"index": self.outputs, "id": _id("msg"), "text": ""}
            self.outputs += 1
            item = {**_message(self.text["id"], "", "in_progress"), "content": []}
            out += self._event("response.output_item.added", output_index=self.text["index"], item=item)
            out += self._event("response.content_part.added", item_id=self.text["id"], output_index=self.text["index"], content_index=0, part=_output_text(""))
        self.text["text"] += text
        place = {"item_id": self.text["id"], "output_index": self.text["index"], "content_index": 0}
        return out + self._event("response.output_text.delta", **place, delta=text, logprobs=[])

    def _called(self, delta: dict[str, Any]) -> bytes:
        index = delta.get("index", 0)
        function = delta.get("function") or {}
        call = self.calls.get(index)
        out = b""
        if call is None:
            call = self.calls[index] = {"index": self.outputs, "id": _id("fc"), "call_id": delta.get("id") or _id("call"), "name": "", "arguments": ""}
            self.outputs += 1
            call["name"] = str(function.get("name") or "")
            item = _call(call["id"], call["call_id"], call["name"], "", call["name"] in self.custom, "in_progress")
            out += self._event("response.output_item.added", output_index=call["index"], item=item)
        elif function.get("name"):
            call["name"] += str(function["name"])
        piece = text_of(function.get("arguments"))
        call["arguments"] += piece
        if piece and call["name"] not in self.custom:  # a custom call's input is whole only once its JSON is
            out += self._event("response.function_call_arguments.delta", item_id=call["id"], output_index=call["index"], delta=piece)
        return out

    def closing(self) -> bytes:
        """The events that end the response, once the chat stream has."""
        out = [self._opening()]
        output: list[tuple[int, Item]] = []
        if self.text is not None:
            text, place = self.text["text"], {"item_id": self.text["id"], "output_index": self.text["index"], "content_index": 0}
            item = _message(self.text["id"], text)
            out += [
                self._event("response.output_text.done", **place, text=text, logprobs=[]),
                self._event("response.content_part.done", **place, part=_output_text(text)),
                self._event("response.output_item.done", output_index=self.text["index"], item=item),
            ]
            output.append((self.text["index"], item))
        for call in self.calls.values():
            item = _call(call["id"], call["call_id"], call["name"], call["arguments"], call["name"] in self.custom)
            if item["type"] == "function_call":
                out.append(self._event("response.function_call_arguments.done", item_id=call["id"], output_index=call["index"], arguments=call["arguments"]))
            out.append(self._event("response.output_item.done", output_index=call["index"], item=item))
            output.append((call["index"], item))
        status = _status(self.finish_reason)
        response = _response(self.asked, self.meta, status, [item for _, item in sorted(output, key=lambda pair: pair[0])], usage(self.usage))
        out.append(self._event(f"response.{status}", response=response))
        return b"".join(out)

    def failure(self, message: str, code: str = "upstream_error") -> bytes:
        """An error midway: the stream ends with it, and no ``response.completed``."""
        return self._opening() + self._event("error", code=code, message=message, param=None)
