"""Anthropic's Messages API over an upstream that speaks only chat completions: the request translated.

``chat_body`` writes a Messages request as a chat completion's body: ``system``
as a system message, ``tool_use`` blocks as the assistant's tool calls, each
``tool_result`` as a ``tool`` message before the rest of its user turn, images
and documents as chat parts, thinking left out; client tools as chat functions
(server tools have no chat form). A field that has no chat form is a 400 that
names it. The answer comes back through ``chat_answer``.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import ClientError
from ..codec import text_of

__all__ = ["chat_body", "stop_sequences"]

Block = dict[str, Any]
SAME = ("model", "max_tokens", "temperature", "top_p", "top_k")


# What a chat upstream is asked in other words (``request``), or what asks nothing of it: marks for
# Anthropic's own cache (``cache_control``; a chat upstream caches prefixes on its own), where and how fast
# Anthropic serves it (``service_tier``, ``inference_geo``, ``speed``, ``diagnostics``), whose request it is
# (``workspace_id``, ``user_profile_id``), and ``context_management`` (thinking is left out anyway, and the
# proxy pages a long conversation rather than clear its tool results): docs/apis.md, field by field.
TRANSLATED = frozenset(
    {"messages", "system", "stop_sequences", "stream", "tools", "tool_choice", "metadata", "output_config", "output_format", "thinking"}
    | {"cache_control", "service_tier", "inference_geo", "speed", "diagnostics", "workspace_id", "user_profile_id", "context_management"}
)
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}


def refused(asked: dict[str, Any]) -> None:
    """The 400 for a field a chat upstream cannot be asked, named (a null asks nothing)."""
    for field, value in asked.items():
        if value is not None and field not in TRANSLATED and field not in SAME:
            _refuse(field, f"{field} has no chat-completions form, and this upstream speaks only chat completions")
    for i, tool in enumerate(asked.get("tools") or ()):
        if not (isinstance(tool, dict) and isinstance(tool.get("input_schema"), dict) and isinstance(tool.get("name"), str)):
            kind = tool.get("type") if isinstance(tool, dict) else tool
            _refuse(f"tools.{i}", f"the server tool {kind!r} cannot run on an upstream that speaks only chat completions: tools with an input_schema can")
    config = asked.get("output_config")
    if isinstance(config, dict) and config.get("effort") is not None and config["effort"] not in EFFORTS:
        _refuse("output_config.effort", f"output_config.effort must be one of {', '.join(EFFORTS)}")


def _refuse(param: str, message: str) -> None:
    """The 400 for ``param``, its name in the message (Anthropic's envelope has no ``param``)."""
    # Anthropic's envelope has no param: the message names it.
    raise ClientError(message if message.startswith(param) else f"{param}: {message}", param=param, code="unsupported_by_upstream")


def _effort(asked: dict[str, Any]) -> str | None:
    """How hard the model should think, as chat's ``reasoning_effort``: ``output_config.effort``, else a thinking budget's size."""
    config = asked.get("output_config")
    if isinstance(config, dict) and config.get("effort") is not None:
        return EFFORTS[config["effort"]]
    thinking = asked.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int):
        return "medium"
    return "low" if budget < 4096 else "medium" if budget < 16384 else "high"


def chat_body(asked: dict[str, Any]) -> dict[str, Any]:
    """The chat completion's body that asks what ``asked`` (a Messages request) asks."""
    refused(asked)
    messages: list[dict[str, Any]] = []
    system = _text(asked.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in asked.get("messages") or ():
        if isinstance(message, dict):
            _add(messages, message)
    chat: dict[str, Any] = {k: asked[k] for k in SAME if k in asked}
    chat["messages"] = messages
    tools = [_tool(tool) for tool in asked.get("tools") or () if isinstance(tool, dict) and "input_schema" in tool and isinstance(tool.get("name"), str)]
    if tools:
        chat["tools"] = tools
        choice = asked.get("tool_choice")
        if isinstance(choice, dict):
            chat["tool_choice"] = _tool_choice(choice)
            if choice.get("disable_parallel_tool_use"):
                chat["parallel_tool_calls"] = False
    response_format = _response_format(asked)
    if response_format is not None:
        chat["response_format"] = response_format
    effort = _effort(asked)
    if effort is not None:
        chat["reasoning_effort"] = effort
    user = (asked.get("metadata") or {}).get("user_id") if isinstance(asked.get("metadata"), dict) else None
    if isinstance(user, str):
        chat["user"] = user
    if asked.get("stream") or stop_sequences(asked):  # the proxy watches for the stop sequences itself (``stops``)
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def stop_sequences(asked: dict[str, Any]) -> list[str]:
    """The request's stop sequences, or the 400 that says they are not a list of strings."""
    sequences = asked.get("stop_sequences")
    if sequences is None:
        return []
    if not isinstance(sequences, list) or not all(isinstance(s, str) for s in sequences):
        raise ClientError("stop_sequences must be a list of strings", param="stop_sequences", code="invalid_value")
    return [s for s in sequences if s]


def _response_format(asked: dict[str, Any]) -> dict[str, Any] | None:
    """Structured output (``output_config.format``, or the beta's ``output_format``) as chat's ``response_format``."""
    config = asked.get("output_config")
    format = config.get("format") if isinstance(config, dict) else None
    if format is None:
        format = asked.get("output_format")
    if format is None:
        return None
    if not isinstance(format, dict) or format.get("type") != "json_schema" or not isinstance(format.get("schema"), dict):
        param = "output_config.format" if isinstance(config, dict) and config.get("format") is not None else "output_format"
        raise ClientError(f"{param} must be {{'type': 'json_schema', 'schema': {{…}}}}", param=param, code="invalid_value")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": format["schema"], "strict": True}}


def _add(messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Add one Messages message to ``messages`` as chat messages: tool results first, as ``tool`` messages."""
    role, content = message.get("role"), message.get("content")
    if not isinstance(content, list):
        messages.append({"role": role, "content": text_of(content)})
        return
    blocks = [block for block in content if isinstance(block, dict)]
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(text_of(b.get("text")) for b in blocks if b.get("type") == "text") or None}
        calls = [_call(block) for block in blocks if block.get("type") == "tool_use"]
        if calls:
            turn["tool_calls"] = calls
        messages.append(turn)
        return
    # A turn's tool results answer the calls just before it: in chat they come first, as tool messages. A chat
    # tool message holds text alone: a result's images and documents follow in the user message after them.
    attached: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") == "tool_result":
            call = str(block.get("tool_use_id") or "")
            messages.append({"role": "tool", "tool_call_id": call, "content": _result(block)})
            inner = block["content"] if isinstance(block.get("content"), list) else []
            files = [part for part in (_part(b) for b in inner if isinstance(b, dict) and b.get("type") != "text") if part is not None]
            if files:
                attached += [{"type": "text", "text": f"(the result of {call} holds these attachments)"}, *files]
    parts = attached + [part for part in (_part(block) for block in blocks) if part is not None]
    if parts:
        texts_only = all(part["type"] == "text" for part in parts)
        messages.append({"role": role, "content": "".join(part["text"] for part in parts) if texts_only else parts})


def _call(block: Block) -> dict[str, Any]:
    """A ``tool_use`` block as a chat tool call."""
    return {
        "id": str(block.get("id") or ""),
        "type": "function",
        "function": {"name": str(block.get("name") or ""), "arguments": json.dumps(block.get("input") or {})},
    }


def _result(block: Block) -> str:
    """A ``tool_result``'s text, an error's marked as one."""
    text = _text(block.get("content"))
    return f"Error: {text}" if block.get("is_error") else text


def _text(value: Any) -> str:
    """Text, or the text of a list of blocks."""
    if isinstance(value, list):
        return "".join(text_of(block.get("text")) for block in value if isinstance(block, dict) and block.get("type") == "text")
    return text_of(value)


def _part(block: Block) -> dict[str, Any] | None:
    """A content block as a chat part (None: a block chat has no part for)."""
    kind, source = block.get("type"), block.get("source")
    if not isinstance(source, dict):
        source = {}
    if kind == "text":
        return {"type": "text", "text": text_of(block.get("text"))}
    if kind == "image" and source.get("type") in ("url", "base64"):
        url = source.get("url") if source.get("type") == "url" else f"data:{source.get('media_type')};base64,{source.get('data')}"
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "document" and source.get("type") == "text":
        return {"type": "text", "text": text_of(source.get("data"))}
    if kind == "document" and source.get("type") == "content":
        return {"type": "text", "text": _text(source.get("content"))}
    if kind == "document" and source.get("type") == "base64":
        return {
            "type": "file",
            "file": {"file_data": f"data:{source.get('media_type')};base64,{source.get('data')}", "filename": block.get("title") or "document"},
        }
    if kind in ("image", "document"):  # a file of Anthropic's Files API, a document by URL: chat has no part that takes them
        _refuse(
            f"{kind}.source", f"an {kind} block whose source is of type {source.get('type')!r} cannot be sent to a chat-completions upstream: send it as base64"
        )
    if kind == "search_result":
        pieces = [text_of(block.get("title")), text_of(block.get("source")), _text(block.get("content"))]
        return {"type": "text", "text": "\n".join(piece for piece in pieces if piece)}
    return None  # thinking, a tool result (a message of its own), a server tool's call or result (refused with its tool)


def _tool(tool: Block) -> dict[str, Any]:
    """A client tool as a chat function."""
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    if tool.get("strict"):
        function["strict"] = True
    return {"type": "function", "function": function}


def _tool_choice(choice: Block) -> Any:
    """A ``tool_choice`` as chat's."""
    kind = choice.get("type")
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"any": "required", "none": "none"}.get(str(kind), "auto")
