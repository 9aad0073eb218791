"""OpenAI's Responses API over an upstream that speaks only chat completions: the request translated.

``chat_body`` writes a Responses request as a chat completion's body: the
``instructions`` as a system message, the input items as messages (a function
call joins the assistant turn it belongs to, its output is a ``tool`` message,
reasoning items are left out), function and custom tools as chat functions.
A request that leans on state the upstream would keep
(``previous_response_id``, ``conversation``, a stored ``prompt``,
``background``, an ``item_reference``) cannot be translated: a 400 says so.
The answer comes back through ``chat_answer``.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import ClientError
from ..codec import text_of
from .wire import STATEFUL

__all__ = ["chat_body"]

Item = dict[str, Any]
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
    """The 400 for ``param``: it has no chat-completions form."""
    raise ClientError(message, param=param, code="unsupported_by_upstream")


def chat_body(asked: dict[str, Any]) -> dict[str, Any]:
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
    """Add one input item to ``messages`` as chat messages: a call joins its turn, an output is a ``tool`` message."""
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
    """An input content part as a chat part (None: a part chat has no form for)."""
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
    """A function call's output as text, for a ``tool`` message."""
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
    """A ``tool_choice`` as chat's."""
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom") and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, dict) and choice.get("mode") == "required":
        return "required"
    return "auto"


def _response_format(format: Any) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (None: plain text)."""
    if not isinstance(format, dict):
        return None
    if format.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: format[k] for k in ("name", "description", "schema", "strict") if k in format}}
    if format.get("type") == "json_object":
        return {"type": "json_object"}
    return None
