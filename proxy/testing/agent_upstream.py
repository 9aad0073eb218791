"""A scripted upstream that drives a real coding agent through a task (``agent_task``), speaking as each provider does.

``AgentScript`` is a ``FakeUpstream``'s answer to every request::

    script = AgentScript(big=True)
    with FakeUpstream(script) as upstream:
        ...  # point the agent (or the proxy in front of it) at upstream.url
    script.turns  # what each request was, and what was answered

It answers chat completions (chunks, ``tool_calls`` deltas, the usage chunk,
``[DONE]``), Responses (``response.created`` … ``function_call`` and
``custom_tool_call`` items with their argument deltas … ``response.completed``)
and Messages (``message_start`` … ``tool_use`` with ``input_json_delta`` …
``message_stop``), streamed or whole as asked; ``/v1/messages/count_tokens``,
``HEAD /`` (Claude Code's connectivity probe) and the models list too.

It keeps the providers' rules on what it is sent and refuses a request that
breaks them with the provider's 400, as the real one would: a tool result
whose call is not in the conversation (all three APIs), a thinking block
without its signature (Messages). ``json_for_stream`` plays a server that
ignores ``stream`` and answers with one JSON object.
"""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import msgspec

from ..headers import ROLE
from .agent_task import aider_reply, conversation_text, decide, evidence, find_cwd, flavor, side_reply, tool_call, tool_defs
from .apis import api_of, message, messages_stream, response, responses_stream
from .replies import Recorded, Reply, completion, stream_reply

__all__ = ["AgentScript", "Turn", "provider_violations"]

APIS = {"/chat/completions": "chat", "/responses": "responses", "/messages": "messages"}
# The prompts with which the agents compact their own history (Claude Code's, Codex's).
COMPACTING = ("create a detailed summary of the conversation so far", "CONTEXT CHECKPOINT COMPACTION")


class Turn(msgspec.Struct):
    """One request the script was sent, and how it answered."""

    api: str  # chat, responses, messages; or what else was asked (count_tokens, probe, unknown)
    path: str
    query: str = ""  # the URL's query string, as it arrived
    role: str = ""  # x-pcp-role: "worker" when the proxy called
    stream: bool = False
    flavor: str = ""  # which agent asked ("claude", "codex", "opencode", "aider", "notools": a side request)
    step: str = ""  # read, grep, edit, test, answer; side, aider
    call: str | None = None  # the tool the answer calls
    paged: bool = False  # the request carries a <PagedContext>
    prompt_tokens: int = 0  # a rough count: characters / 4
    status: int = 200
    refused: str = ""  # the provider's rule the request broke
    compacting: bool = False  # the agent's own compaction: its prompt asks for a summary of the conversation
    seen: tuple[str, ...] = ()  # which steps' output the request holds (``agent_task.evidence``)


class AgentScript:
    """``FakeUpstream``'s default: each request answered as its provider would, by the task's script."""

    def __init__(self, *, big: bool = False, json_for_stream: bool = False, parts: int = 0, window: int = 0):
        self.big = big  # the grep step also prints 24 kB of notes: the history grows past a proxy's threshold
        self.json_for_stream = json_for_stream
        self.parts = parts  # a longer task: the notes in parts, a step each (``agent_task.decide``)
        self.window = window  # the model's context window (0: none): a longer prompt is refused in the provider's words
        self.turns: list[Turn] = []
        self._lock = threading.Lock()

    def __call__(self, recorded: Recorded) -> Reply:
        """The scripted reply to a recorded call, the turn noted."""
        turn, reply = self._answer(recorded)
        with self._lock:
            self.turns.append(turn)
        return reply

    def _answer(self, recorded: Recorded) -> tuple[Turn, Reply]:
        """The turn a call is, and the reply the script gives it."""
        path = recorded.path
        below = path[path.find("/v1") + 3 :] if "/v1" in path else path
        turn = Turn(api="unknown", path=path, query=recorded.query, role=recorded.headers.get(ROLE, ""))
        if below in ("", "/") and recorded.method in ("GET", "HEAD"):
            turn.api = "probe"
            return turn, Reply(body=b"{}")
        if recorded.method == "POST" and below == "/messages/count_tokens":
            turn.api = "count_tokens"
            body = json.loads(recorded.body)
            tokens = _tokens(conversation_text(body)) + _tokens(json.dumps(body.get("tools") or []))
            return turn, Reply(body=json.dumps({"input_tokens": tokens}).encode())
        if recorded.method != "POST" or below not in APIS:
            turn.status = 404
            return turn, _error(404, "not_found_error", f"no route {recorded.method} {path}", anthropic="anthropic-version" in recorded.headers)
        turn.api = api_of(recorded)
        try:
            body = json.loads(recorded.body)
        except ValueError:
            turn.status = 400
            return turn, _error(400, "invalid_request_error", "the body is not JSON", anthropic=turn.api == "messages")
        broken = provider_violations(turn.api, body)
        if broken:
            turn.status, turn.refused = 400, broken[0]
            return turn, _error(400, "invalid_request_error", broken[0], anthropic=turn.api == "messages")
        return turn, self._complete(turn, body)

    def _complete(self, turn: Turn, body: dict[str, Any]) -> Reply:
        """The scripted answer of a paged or plain call: a tool call of the task's next step, or its end."""
        text, tools = conversation_text(body), tool_defs(turn.api, body)
        turn.flavor, turn.stream = flavor(tools, text), bool(body.get("stream")) and not self.json_for_stream
        turn.paged, turn.prompt_tokens = "<PagedContext" in text, _tokens(text) + _tokens(json.dumps(body.get("tools") or []))
        turn.compacting = any(prompt in text for prompt in COMPACTING)
        turn.seen = evidence(text, self.parts)
        if self.window and turn.prompt_tokens > self.window:
            turn.status, turn.refused = 400, f"{turn.prompt_tokens} tokens > {self.window}"
            return _too_long(turn.api, turn.prompt_tokens, self.window)
        call = None
        if turn.flavor == "aider":
            turn.step, answer = "aider", aider_reply(text, self.big, self.parts)
        elif turn.flavor == "notools":
            turn.step, answer = "side", side_reply(text)
        else:
            step = decide(text, self.big, self.parts)
            turn.step = step["step"]
            call = tool_call(step, tools, find_cwd(text)) if turn.step != "answer" else None
            answer = "" if call else step.get("text") or f"Cannot carry out step {turn.step} with tools {sorted(tools)}."
        turn.call = call[0] if call else None
        custom = call is not None and tools.get(call[0], {}).get("kind") == "custom"
        return _reply(turn.api, turn.stream, str(body.get("model") or "scripted-model"), answer, call, custom, turn.prompt_tokens)


def _tokens(text: str) -> int:
    """A rough token count of ``text``: four characters a token."""
    return max(1, len(text) // 4)


def _reply(api: str, stream: bool, model: str, text: str, call: tuple[str, Any] | None, custom: bool, prompt_tokens: int) -> Reply:
    """The answer in ``api``'s shape: ``text``, or one call of a tool."""
    content = text or None
    counts: dict[str, Any] = {"input_tokens": prompt_tokens, "output_tokens": _tokens(text + json.dumps(call[1] if call else ""))}
    if api == "chat":
        calls = [{"id": "call_" + _id(), "type": "function", "function": {"name": call[0], "arguments": json.dumps(call[1])}}] if call else None
        usage = {"prompt_tokens": counts["input_tokens"], "completion_tokens": counts["output_tokens"]}
        if stream:
            return stream_reply([text] if text else [], model=model, tool_calls=calls, usage={**usage, "total_tokens": sum(usage.values())})
        return completion(text, model=model, tool_calls=calls, **usage)
    if api == "responses":
        kinds: dict[str, Any] = {"custom_calls": [call]} if call and custom else {"function_calls": [call]} if call else {}
        return responses_stream([text] if text else None, model=model, **kinds, **counts) if stream else response(content, model=model, **kinds, **counts)
    uses = [call] if call else []
    return (
        messages_stream([text] if text else None, tool_uses=uses, model=model, **counts) if stream else message(content, tool_uses=uses, model=model, **counts)
    )


_ids = itertools.count(1)


def _id() -> str:
    """A new id for a scripted call."""
    return f"scripted{next(_ids)}"


def _too_long(api: str, tokens: int, window: int) -> Reply:
    """A prompt longer than the model's window refused as the provider refuses it: Anthropic's words, or OpenAI's with its code."""
    if api == "messages":
        return _error(400, "invalid_request_error", f"prompt is too long: {tokens} tokens > {window} maximum", anthropic=True)
    text = (
        f"This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages."
    )
    return Reply(
        status=400,
        body=json.dumps({"error": {"message": text, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}).encode(),
    )


def _error(status: int, kind: str, text: str, *, anthropic: bool) -> Reply:
    """An error reply in the API's envelope: Anthropic's or OpenAI's."""
    body = {"type": "error", "error": {"type": kind, "message": text}} if anthropic else {"error": {"message": text, "type": kind, "code": None}}
    return Reply(status=status, body=json.dumps(body).encode())


# -- the providers' rules on a conversation ------------------------------------------------


def provider_violations(api: str, body: dict[str, Any]) -> list[str]:
    """What a provider would refuse in ``body``: a tool's result without the call that asked for it, a thinking block without its signature."""
    if api == "chat":
        return _chat_violations(body.get("messages") or [])
    if api == "responses":
        return _responses_violations(body.get("input"))
    return _messages_violations(body.get("messages") or [])


def _chat_violations(messages: list[Any]) -> list[str]:
    """What breaks chat's rules in ``messages``: a tool message that answers no call."""
    out, called = [], set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        if m.get("role") == "assistant":
            called = {c.get("id") for c in m.get("tool_calls") or () if isinstance(c, dict)}
        elif m.get("role") == "tool" and m.get("tool_call_id") not in called:
            out.append(f"messages.[{i}]: messages with role 'tool' must be a response to a preceding message with 'tool_calls'")
    return out


def _responses_violations(items: Any) -> list[str]:
    """What breaks the Responses API's rules in the input items: an output that answers no call."""
    out, called = [], set()
    for i, item in enumerate(items if isinstance(items, list) else ()):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in ("function_call", "custom_tool_call"):
            called.add(item.get("call_id"))
        elif isinstance(kind, str) and kind in ("function_call_output", "custom_tool_call_output") and item.get("call_id") not in called:
            out.append(f"input.[{i}]: No tool call found for function call output with call_id {item.get('call_id')}.")
    return out


def _messages_violations(messages: list[Any]) -> list[str]:
    """What breaks Anthropic's rules in ``messages``: a tool result that answers no call just before it."""
    out: list[str] = []
    previous: set[str] = set()
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        for j, block in enumerate(blocks):
            kind = block.get("type")
            if kind == "tool_result" and block.get("tool_use_id") not in previous:
                out.append(f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {block.get('tool_use_id')}")
            elif kind == "thinking" and not block.get("signature"):
                out.append(f"messages.{i}.content.{j}.thinking.signature: Field required")
            elif kind == "redacted_thinking" and not block.get("data"):
                out.append(f"messages.{i}.content.{j}.redacted_thinking.data: Field required")
        if isinstance(m, dict) and m.get("role") == "assistant":
            previous = {str(b.get("id")) for b in blocks if b.get("type") == "tool_use"}
        elif isinstance(m, dict) and m.get("role") == "user":
            previous = set()
    return out
