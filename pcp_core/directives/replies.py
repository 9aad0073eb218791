"""What a worker's reply asks for: directives in its text or as native tool calls, or a call of the client's own tools."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from .parser import parse_directives
from .vocabulary import FIELDS, KINDS, BusFault, Directive, Explore

__all__ = ["DIRECTIVE_TOOLS", "WorkerReply", "calls_client_tool", "read_reply"]

# The same three directives as native tools, for PCP_DIRECTIVE_CHANNEL=tools: their arguments are the directives' own.
DIRECTIVE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": f"pcp_{name.lower()}",
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {field: {"type": "string"} for field in FIELDS[name]},
                "required": list(FIELDS[name]),
            },
        },
    }
    for name, description in (
        ("Consult", "Open a page of the PagedContext one level: Summary to Detail, a Consolidated Detail to Unpacked."),
        ("Shelve", "Fold a page of the PagedContext you no longer need."),
        ("Explore", "Search the pages under a page id (or 'history') for comma-separated keywords."),
    )
]
_TOOL_DIRECTIVES: dict[str, type[Directive]] = {f"pcp_{name.lower()}": kind for name, kind in KINDS.items()}


class WorkerReply(msgspec.Struct, frozen=True):
    text: str
    tool_calls: list[dict[str, Any]] = []
    # The host already streamed this reply to the client as the answer.
    delivered: bool = False


def _tool_name(tool_or_call: dict[str, Any]) -> str | None:
    """The function name of a tool or a tool call (None for a tool of another type)."""
    function = tool_or_call.get("function")  # a client's tool of another type has none
    return function.get("name") if isinstance(function, dict) else None


def calls_client_tool(tool_calls: list[dict[str, Any]], client_tools: list[dict[str, Any]]) -> bool:
    """Whether the worker called one of the client's own tools (which ends the loop)."""
    names = {_tool_name(tool) for tool in client_tools}
    return any(_tool_name(call) in names for call in tool_calls)


def read_reply(reply: WorkerReply) -> tuple[str, list[Directive], list[BusFault]]:
    """Directives from the text and from native tool calls, and the text without them."""
    text, directives, faults = parse_directives(reply.text)
    for call in reply.tool_calls:
        function: dict[str, Any] = call.get("function") or {}
        raw = f"{function.get('name')}({function.get('arguments', '')})"
        kind = _TOOL_DIRECTIVES.get(function.get("name", ""))
        if kind is None:  # neither a directive nor one of the client's tools
            faults.append(BusFault(raw=raw, reason=f"there is no tool named {function.get('name')!r}"))
            continue
        try:
            args = json.loads(function.get("arguments") or "{}")
            if not isinstance(args, dict):
                raise TypeError(f"expected an object, got {type(args).__name__}")
            if kind is Explore and isinstance(args.get("keywords"), str):  # "a, b" as well as ["a", "b"]
                args["keywords"] = args["keywords"].split(",")
            directive = msgspec.convert(args, kind)
            if isinstance(directive, Explore):
                directive = msgspec.structs.replace(directive, keywords=tuple(k.strip() for k in directive.keywords if k.strip()))
            directives.append(directive)
        except (ValueError, TypeError, msgspec.ValidationError) as exc:
            faults.append(BusFault(raw=raw, reason=f"{function.get('name')} arguments are not valid: {exc}"))
    return text, directives, faults
