"""Reading a chat-completions request: only what the proxy needs, the rest stays bytes."""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import ProxyError

__all__ = ["ChatRequest", "parse_chat_request"]


class ChatRequest(msgspec.Struct):
    # Messages stay plain dicts: fields the proxy does not model must survive.
    messages: list[dict[str, Any]]
    stream: bool = False
    model: str | None = None


_DECODER = msgspec.json.Decoder(ChatRequest)


def parse_chat_request(body: bytes) -> ChatRequest:
    try:
        request = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = "messages" if "messages" in text else None
        raise ProxyError.bad_request(f"invalid chat request: {text}", param=param) from None
    except msgspec.DecodeError as exc:
        raise ProxyError.bad_request(f"request body is not valid JSON: {exc}") from None
    for i, message in enumerate(request.messages):
        if not isinstance(message.get("role"), str):
            raise ProxyError.bad_request(f"messages[{i}] has no role", param=f"messages.[{i}].role")
    return request
