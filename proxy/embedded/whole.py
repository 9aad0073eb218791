"""A whole chat completion from the embedded server, asked for as a stream so that a client who leaves stops it.

llama-server notices that the client of a streamed answer has left at its next
token (the write fails). For an answer asked whole it has only a check once a
second, which any other result resets: while another slot streams, or anyone
polls it, a client that left a long whole answer kept its slot generating to
the end (``bench/first_run.py`` has a client leave a whole answer). So a chat completion asked
whole goes to it streamed, and the proxy puts the answer together: the client
gets the same ``chat.completion``, and one that leaves closes the stream.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from ..apis.chat.chunks import collect_tool_calls
from ..decoding import strict_json
from ..sse import DONE, DataLines

__all__ = ["assembled", "streamed_request"]


def streamed_request(request: httpx.Request) -> httpx.Request | None:
    """``request`` asking for its answer streamed, with its usage; None when it is not a chat completion asked whole."""
    if not request.url.path.endswith("/chat/completions"):
        return None
    try:
        body = json.loads(request.content)
    except ValueError:
        return None  # the server's own 400
    if not isinstance(body, dict) or body.get("stream") or (body.get("n") or 1) != 1:
        return None
    body.update(stream=True, stream_options={"include_usage": True})
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    return httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body).encode(), extensions=request.extensions)


async def assembled(response: httpx.Response) -> tuple[int, bytes]:
    """The stream's chunks read to the end and put together as one ``chat.completion`` (or the error it ended in)."""
    completion: dict[str, Any] = {"object": "chat.completion", "choices": []}
    message: dict[str, Any] = {"role": "assistant", "content": None}
    calls: dict[int, dict[str, Any]] = {}
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": None}
    logprobs: list[Any] = []
    lines = DataLines()
    async for raw in response.aiter_raw():
        for data in lines.feed(raw):
            chunk = _chunk(data)
            if chunk is None:
                continue
            if "error" in chunk and not chunk.get("choices"):
                return 500, json.dumps({"error": chunk["error"]}).encode()
            completion.update({k: chunk[k] for k in ("id", "created", "model", "system_fingerprint", "usage") if chunk.get(k) is not None})
            for choice_delta in chunk.get("choices") or ():
                delta = choice_delta.get("delta") or {}
                for field in ("content", "reasoning_content"):
                    if delta.get(field):
                        message[field] = (message.get(field) or "") + delta[field]
                collect_tool_calls(calls, delta.get("tool_calls") or ())
                logprobs += ((choice_delta.get("logprobs") or {}).get("content")) or []
                choice["finish_reason"] = choice_delta.get("finish_reason") or choice["finish_reason"]
    if choice["finish_reason"] is None:  # cut short: the server stopped, or went away
        return 502, json.dumps({"error": {"message": "the embedded model's answer stopped before its end", "type": "server_error"}}).encode()
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    if logprobs:
        choice["logprobs"] = {"content": logprobs}
    completion["choices"] = [choice]
    return 200, json.dumps(completion).encode()


def _chunk(data: bytes) -> dict[str, Any] | None:
    """One ``data:`` line's chunk (None: ``[DONE]``, or what is not a JSON object)."""
    if data == DONE:
        return None
    try:
        chunk = strict_json(data)  # a number past a double's range is not read as Infinity, to be written back so
    except (ValueError, RecursionError):
        return None
    return chunk if isinstance(chunk, dict) else None
