"""A hostile-byte set, kept aside: bytes that are not UTF-8 (or not JSON) in every string field of an agent's request,
in all three APIs and both modes. Never a proxy 500; in a field the proxy reads, a 400 that names it.

The set is fixed (``HOSTILE``) and the places are the fields a coding agent's
request has (``PLACES``): what the proxy reads (the conversation, the tools,
the model) and what it forwards unread (``user``, ``metadata``), which the
upstream judges. ``test_fuzz_bytes.py`` searches chat bodies at random; this
goes through every place with every byte sequence.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from proxy.app import create_app
from proxy.cli.server import server_options
from proxy.settings import Settings
from proxy.testing.upstream import FakeUpstream, serve_in_thread

# Bytes a JSON string may not hold as UTF-8: a lone 0xff, an invalid pair, a UTF-8 surrogate, past U+10FFFF,
# a cut sequence, a lone continuation, an overlong "/", a reversed BOM, a control byte (invalid JSON), a lone
# surrogate's escape (JSON, but no text).
HOSTILE = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80", b"\xc0\xaf", b"\xfe\xff", b"\x01", b"\\ud800"]
# Streamed, the same requests take the same reading: a few of the set show it (each request costs ~50 ms).
STREAMED = [b"\xff", b"\xed\xa0\x80", b"\\ud800"]
MARK = "@@HOSTILE@@"  # where the bytes go: replaced in the encoded body

TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": json.dumps({"path": MARK})}}
CHAT = {
    "model": "m",
    "user": MARK,
    "metadata": {"app": MARK},
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"fix the bug {MARK}"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"def add(a, b): {MARK}"},
    ],
    "tools": [{"type": "function", "function": {"name": "read", "description": f"Read a file {MARK}", "parameters": {"type": "object"}}}],
}
RESPONSES = {
    "model": "m",
    "instructions": f"You are Codex {MARK}",
    "metadata": {"app": MARK},
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": f"fix the bug {MARK}"}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": json.dumps({"cmd": MARK})},
        {"type": "function_call_output", "call_id": "c1", "output": f"ok {MARK}"},
    ],
    "tools": [{"type": "function", "name": "exec_command", "description": f"Run {MARK}", "parameters": {"type": "object"}}],
}
MESSAGES = {
    "model": "m",
    "max_tokens": 100,
    "system": [{"type": "text", "text": f"You are Claude Code {MARK}"}],
    "metadata": {"user_id": MARK},
    "messages": [
        {"role": "user", "content": f"fix the bug {MARK}"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": MARK}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": f"def add(a, b): {MARK}"}]},
    ],
    "tools": [{"name": "Read", "description": f"Read a file {MARK}", "input_schema": {"type": "object"}}],
}
# Each API's body, and each place in it: the path of the string the bytes go in, and whether the proxy reads it.
APIS = {"chat": ("/v1/chat/completions", CHAT), "responses": ("/v1/responses", RESPONSES), "messages": ("/v1/messages", MESSAGES)}
PLACES = {
    "chat": [
        ("messages.[1].content", True),
        ("messages.[2].tool_calls.[0].function.arguments", True),
        ("messages.[3].content", True),
        ("tools.[0].function.description", True),
        ("user", False),
        ("metadata.app", False),
    ],
    "responses": [
        ("instructions", True),
        ("input.[0].content.[0].text", True),
        ("input.[1].arguments", True),
        ("input.[2].output", True),
        ("tools.[0].description", True),
        ("metadata.app", False),
    ],
    "messages": [
        ("system.[0].text", True),
        ("messages.[0].content", True),
        ("messages.[1].content.[0].input.file_path", True),
        ("messages.[2].content.[0].content", True),
        ("tools.[0].description", True),
        ("metadata.user_id", False),
    ],
}
CASES = [(api, place, read) for api, places in PLACES.items() for place, read in places]


def hostile_body(api: str, place: str, hostile: bytes) -> bytes:
    """``api``'s body with ``hostile`` in the string at ``place`` (the others keep their text, without the mark)."""
    body = json.loads(json.dumps(APIS[api][1]))
    *parents, last = [int(key[1:-1]) if key.startswith("[") else key for key in place.split(".")]
    node = body
    for key in parents:
        node = node[key]
    node[last] = node[last].replace(MARK, HERE)
    return json.dumps(body).encode().replace(MARK.encode(), b"").replace(HERE.encode(), hostile)


HERE = "@@HERE@@"


@pytest.fixture(scope="module")
def proxy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with FakeUpstream() as upstream:
        settings = Settings(upstream_base_url=upstream.url, data_dir=str(tmp_path_factory.mktemp("data")), router_embeddings=False, max_rounds=1)
        server = serve_in_thread(create_app(settings), **server_options(settings))
        yield server.url
        server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("mode", ["off", "force"], ids=["passthrough", "protocol"])
@pytest.mark.parametrize(("api", "place", "read"), CASES, ids=[f"{api}:{place}" for api, place, _ in CASES])
def test_hostile_bytes_in_any_field_never_get_a_proxy_500_and_a_read_field_is_named(proxy_url, api, place, read, mode, stream):
    path = APIS[api][0]
    headers = {"content-type": "application/json", "authorization": "Bearer k", "x-pcp-mode-request": mode}
    if api == "messages":
        headers["anthropic-version"] = "2023-06-01"
    for hostile in STREAMED if stream else HOSTILE:
        content = hostile_body(api, place, hostile).replace(b'"model": "m"', b'"model": "m", "stream": %s' % (b"true" if stream else b"false"))
        answer = httpx.post(f"{proxy_url}{path}", content=content, headers=headers, timeout=30)
        said = f"{api} {place} {hostile!r} ({mode}): {answer.status_code} {answer.content[:300]!r}"
        assert answer.status_code < 500 and b"internal proxy error" not in answer.content, said
        if read:
            assert answer.status_code == 400, said
            error = answer.json()["error"]
            if hostile not in (b"\x01", b"\\ud800"):  # not JSON at all: the body's fault, no field to name
                assert f"`{place}` is not valid UTF-8" in error["message"], said
                # OpenAI's envelope names it in ``param``; Anthropic's has only the message, which ends with the code.
                assert (error["param"], error["code"]) == (place, "invalid_encoding") if api != "messages" else "(invalid_encoding)" in error["message"], said
