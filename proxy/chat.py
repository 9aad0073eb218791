"""Reading a chat-completions request: only what the proxy needs, the rest stays bytes."""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from .errors import ProxyError

__all__ = ["ChatRequest", "parse_chat_request"]


class ToolFunction(msgspec.Struct):
    name: str


class Tool(msgspec.Struct):
    function: ToolFunction | None = None  # a tool of another type (a custom tool) has none


class ChatRequest(msgspec.Struct):
    """What the proxy reads of a request; validating it here turns a wrong type into a 400, not a failure later.

    Only the types are checked: the request goes upstream as the client sent it.
    """

    # Messages stay plain dicts: fields the proxy does not model must survive.
    messages: list[dict[str, Any]]
    stream: bool = False
    model: str | None = None
    # Read in protocol mode: the client's own tools end the round loop when called,
    # ``include_usage`` asks for the usage chunk of a stream, ``n`` for several answers.
    tools: list[Tool] | None = None
    stream_options: dict[str, Any] | None = None
    n: Annotated[int, msgspec.Meta(ge=1)] | None = None


_DECODER = msgspec.json.Decoder(ChatRequest)


def parse_chat_request(body: bytes) -> ChatRequest:
    try:
        request = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        raise ProxyError.bad_request(f"invalid chat request: {text}", param=_param(text)) from None
    except msgspec.DecodeError as exc:
        raise ProxyError.bad_request(f"request body is not valid JSON: {exc}") from None
    for i, message in enumerate(request.messages):
        if not isinstance(message.get("role"), str):
            raise ProxyError.bad_request(f"messages[{i}] has no role", param=f"messages.[{i}].role")
    return request


# msgspec ends a message with where it failed: "… - at `$.messages[0].role`".
_AT = re.compile(r"at `\$\.([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def _param(message: str) -> str | None:
    """The field a validation error is about, written as OpenAI writes ``param`` (``messages.[0].role``)."""
    at = _AT.search(message) or _MISSING.search(message)
    return at.group(1).replace("[", ".[") if at else None
