"""The proxy's own API (/v1/pcp) under hostile and oversized input: a 400 or 413 that says what is wrong, never a 500.

The set below is the one kept aside for it: each case of issue 36 and its
neighbours, sent as an attacker would, on the embedded store and on a real
Redis. Every answer is in the error envelope with a code; a limit's 413 names
its setting; what was refused is not kept.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.testing.upstream import completion

AUTH = {"authorization": "Bearer sk-a"}
BIG = 2**64  # past what msgpack and Redis keep
SESSION = "/v1/pcp/sessions/s1"


def page(pid: str, content: str = "the orchard, apple varieties and grafting", **fields: Any) -> dict[str, Any]:
    return {
        "type": "Original",
        "id": pid,
        "origin": "Storage",
        "depth": 0,
        "timestamp": "2026-01-01T00:00:00",
        "keywords": ["orchard"],
        "summary": "orchard notes",
        "content": content,
        **fields,
    }


def block(bid: str = "b1", **fields: Any) -> dict[str, Any]:
    return {"id": bid, "type": "fact", "decay": 0.1, "confidence": 0.9, "round": 1, "tags": ["t"], "content": "the user likes tea", **fields}


def lines(*items: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


def component(**fields: Any) -> dict[str, Any]:
    return {"at": "d-1,1,0", "content": "be brief", **fields}


# (name, method, path, body (bytes, or JSON), status, code): every case answered as said, never a 500.
CASES: list[tuple[str, str, str, Any, int, str | None]] = [
    # ids ending in a newline, and their neighbours
    ("scope ending in a newline", "GET", "/v1/pcp/memory/alice%0A", None, 400, "invalid_memory_scope"),
    ("scope ending in CR LF", "GET", "/v1/pcp/memory/alice%0D%0A", None, 400, "invalid_memory_scope"),
    ("scope with a NUL", "GET", "/v1/pcp/memory/al%00ice", None, 400, "invalid_memory_scope"),
    ("session ending in a newline", "GET", "/v1/pcp/sessions/s1%0A/components", None, 400, "invalid_session"),
    ("component key ending in a newline", "POST", f"{SESSION}/components", component(key="k\n"), 400, "invalid_component"),
    ("imported page id ending in a newline", "POST", "/v1/pcp/memory/alice/import", lines(page("p1\n")), 400, None),
    # bodies that are not UTF-8, not JSON, or nested past a decoder
    ("components body not UTF-8", "POST", f"{SESSION}/components", b'{"at": "d-1,1,0", "content": "\xff\xfe"}', 400, "invalid_encoding"),
    ("forget body not UTF-8", "POST", "/v1/pcp/memory/alice/forget", b'{"query": "\xc3\x28"}', 400, "invalid_encoding"),
    ("todo body not UTF-8", "PUT", f"{SESSION}/todo", b'{"items": [{"id": 1, "title": "\xff"}]}', 400, "invalid_encoding"),
    ("import body not UTF-8", "POST", "/v1/pcp/memory/alice/import", b'{"type": "Original", "id": "\xff"}\n', 400, "invalid_encoding"),
    ("forget body not JSON", "POST", "/v1/pcp/memory/alice/forget", b"ids=1", 400, None),
    ("forget body of the wrong shape", "POST", "/v1/pcp/memory/alice/forget", {"ids": "p1"}, 400, "invalid_forget"),
    ("forget with an unknown field", "POST", "/v1/pcp/memory/alice/forget", {"ids": ["p1"], "all": True}, 400, "invalid_forget"),
    ("todo body a lone surrogate", "PUT", f"{SESSION}/todo", b'{"items": [{"id": 1, "title": "\\ud800"}]}', 400, None),
    ("a selector of 5000 digits", "GET", f"{SESSION}/components?select=d{'9' * 5000},*,*", None, 400, "invalid_selector"),
    ("a selector past 64 bits", "GET", f"{SESSION}/components?select=d0-{BIG},*,*", None, 400, "invalid_selector"),
    ("a list limit past 64 bits", "GET", f"/v1/pcp/memory/alice/pages?limit={BIG}", None, 400, None),
    ("a cursor of 5000 digits", "GET", f"/v1/pcp/memory/alice/pages?cursor={'9' * 5000}", None, 400, None),
    # integers past 64 bits
    ("component ttl 2^64", "POST", f"{SESSION}/components", component(ttl=BIG), 400, "invalid_component"),
    ("component cadence 2^64", "POST", f"{SESSION}/components", component(cadence=BIG), 400, "invalid_component"),
    ("component depth 10^23 in at", "POST", f"{SESSION}/components", component(at=f"d{10**23},1,0"), 400, "invalid_component"),
    ("component offset -10^21 in at", "POST", f"{SESSION}/components", component(at=f"d-1,1,{-(10**21)}"), 400, "invalid_component"),
    ("component position 2^63 in at", "POST", f"{SESSION}/components", component(at=f"d-1,{2**63},0"), 400, "invalid_component"),
    ("todo id 2^64", "PUT", f"{SESSION}/todo", {"items": [{"id": BIG, "title": "x"}]}, 400, "invalid_todo"),
    ("todo id 2^63", "PUT", f"{SESSION}/todo", {"items": [{"id": 2**63, "title": "x"}]}, 400, "invalid_todo"),
    ("imported page depth 10^30", "POST", "/v1/pcp/memory/alice/import", lines(page("p1", depth=10**30)), 400, "number_out_of_range"),
    ("imported page turn -2^64", "POST", "/v1/pcp/memory/alice/import", lines(page("p1", first_turn=-BIG)), 400, "number_out_of_range"),
    (
        "imported Core block round 10^30",
        "POST",
        "/v1/pcp/memory/alice/import",
        lines({"type": "Core", "blocks": [block(round=10**30)]}),
        400,
        "number_out_of_range",
    ),
    # Core blocks held to a round's rules
    ("imported Core block decay 5.0", "POST", "/v1/pcp/memory/alice/import", lines({"type": "Core", "blocks": [block(decay=5.0)]}), 400, "invalid_core_block"),
    (
        "imported Core block confidence -3",
        "POST",
        "/v1/pcp/memory/alice/import",
        lines({"type": "Core", "blocks": [block(confidence=-3.0)]}),
        400,
        "invalid_core_block",
    ),
    ("imported Core block faded", "POST", "/v1/pcp/memory/alice/import", lines({"type": "Core", "blocks": [block(decay=0.95)]}), 400, "invalid_core_block"),
    ("imported Core block round -1", "POST", "/v1/pcp/memory/alice/import", lines({"type": "Core", "blocks": [block(round=-1)]}), 400, "invalid_core_block"),
    (
        "imported Core placeholder",
        "POST",
        "/v1/pcp/memory/alice/import",
        lines({"type": "Core", "blocks": [block(content_state="tag_ref", tag_id="x")]}),
        400,
        "invalid_core_block",
    ),
    # sizes (the limits are set small below: the 413 names each setting)
    ("a 20 MB component", "POST", f"{SESSION}/components", component(content="x" * 20_000_000), 413, "limit_exceeded"),
    ("a component over component_max_kb", "POST", f"{SESSION}/components", component(content="x" * 5000), 413, "limit_exceeded"),
    ("a page over memory_page_max_kb", "POST", "/v1/pcp/memory/alice/import", lines(page("p1", content="y" * 10_000)), 413, "limit_exceeded"),
    (
        "an import over memory_import_max_mb",
        "POST",
        "/v1/pcp/memory/alice/import",
        lines(*(page(f"p{i}", content="z" * 3000) for i in range(400))),
        413,
        "limit_exceeded",
    ),
    ("an import over memory_import_max_pages", "POST", "/v1/pcp/memory/alice/import", lines(*(page(f"p{i}") for i in range(60))), 413, "limit_exceeded"),
    (
        "a Core block over hybrid_block_max_kb",
        "POST",
        "/v1/pcp/memory/alice/import",
        lines({"type": "Core", "blocks": [block(content="w" * 3000)]}),
        413,
        "limit_exceeded",
    ),
    ("a todo body over api_max_body_kb", "PUT", f"{SESSION}/todo", {"items": [{"id": i, "title": "t" * 1000} for i in range(1, 40)]}, 413, "limit_exceeded"),
    ("a forget body over api_max_body_kb", "POST", "/v1/pcp/memory/alice/forget", {"ids": ["p" * 100] * 400}, 413, "limit_exceeded"),
]
# Bodies nested past a decoder, sent where the limits let them be read (those below would refuse them first).
NESTED = [
    ("import line nested 200k deep", "POST", "/v1/pcp/memory/alice/import", b"[" * 200_000 + b"]" * 200_000 + b"\n", 400, None),
    (
        "import page nested 100k deep",
        "POST",
        "/v1/pcp/memory/alice/import",
        b'{"type": "Original", "id": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        400,
        None,
    ),
    ("import Core line nested deep", "POST", "/v1/pcp/memory/alice/import", b'{"type": "Core", "blocks": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    ("forget body nested deep", "POST", "/v1/pcp/memory/alice/forget", b'{"ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    ("components body nested deep", "POST", f"{SESSION}/components", b'{"at": "d-1,1,0", "tags": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    ("todo body nested deep", "PUT", f"{SESSION}/todo", b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
]
# Small limits, so that each is reached by a body of kilobytes.
LIMITS = {
    "api_max_body_kb": 32,
    "component_max_kb": 4,
    "memory_import_max_mb": 1,
    "memory_import_max_pages": 50,
    "memory_page_max_kb": 8,
    "hybrid_block_max_kb": 2,
    "hybrid": "enabled",
}
SETTING = {
    "a 20 MB component": "api_max_body_kb",
    "a component over component_max_kb": "component_max_kb",
    "a page over memory_page_max_kb": "memory_page_max_kb",
    "an import over memory_import_max_mb": "memory_import_max_mb",
    "an import over memory_import_max_pages": "memory_import_max_pages",
    "a Core block over hybrid_block_max_kb": "hybrid_block_max_kb",
    "a todo body over api_max_body_kb": "api_max_body_kb",
    "a forget body over api_max_body_kb": "api_max_body_kb",
}


def send(proxy: Any, method: str, path: str, body: Any) -> Any:
    content = body if isinstance(body, bytes | None) else json.dumps(body).encode()
    return proxy.http.request(method, path, content=content, headers={**AUTH, "content-type": "application/json"})


@pytest.fixture(params=["embedded", "redis"])
def hostile_proxy(request, start_proxy):
    store = request.getfixturevalue("redis_server").url if request.param == "redis" else ""
    return start_proxy(store=store, **LIMITS) if store else start_proxy(**LIMITS)


def answered_wrong(proxy: Any, cases: list[tuple[str, str, str, Any, int, str | None]]) -> list[str]:
    """The cases not answered with their status and code, in the envelope, a 413 naming its setting."""
    wrong = []
    for name, method, path, body, status, code in cases:
        answer = send(proxy, method, path, body)
        error = answer.json().get("error", {}) if answer.headers.get("content-type", "").startswith("application/json") else {}
        ok = answer.status_code == status and (code is None or error.get("code") == code) and error.get("message")
        if status == 413 and ok:
            ok = SETTING[name] in error["message"]
        if not ok:
            wrong.append(f"{name}: {answer.status_code} {answer.text[:300]}")
    return wrong


def test_the_hostile_set_is_answered_with_400s_and_413s_never_a_500_and_nothing_refused_is_kept(hostile_proxy):
    wrong = answered_wrong(hostile_proxy, CASES)
    assert not wrong, "\n".join(wrong)
    for kept in ("components", "todo"):  # no session was made of what was refused
        assert send(hostile_proxy, "GET", f"{SESSION}/{kept}", None).json()["error"]["code"] == "session_not_found"
    assert send(hostile_proxy, "GET", "/v1/pcp/memory/alice", None).json()["pages"] == 0


def test_bodies_nested_past_a_decoder_are_400s(start_proxy):
    proxy = start_proxy(hybrid="enabled", api_max_body_kb=4096, memory_page_max_kb=4096)
    wrong = answered_wrong(proxy, NESTED)
    assert not wrong, "\n".join(wrong)


def test_values_at_the_edge_of_each_limit_are_kept(hostile_proxy):
    """The neighbours on the good side: the largest number a store keeps, a component and a page just within their limits."""
    edge = send(hostile_proxy, "POST", f"{SESSION}/components", component(content="x" * 4096, ttl=2**63 - 1, at=f"d-1,{2**62},{-(2**62)}"))
    assert edge.status_code == 201, edge.text
    assert send(hostile_proxy, "PUT", f"{SESSION}/todo", {"items": [{"id": 2**63 - 1, "title": "x"}]}).status_code == 200
    imported = send(
        hostile_proxy, "POST", "/v1/pcp/memory/alice/import", lines(page("p1", content="y" * 7000, depth=2**63 - 1), {"type": "Core", "blocks": [block()]})
    )
    assert imported.status_code == 200 and imported.json() == {"imported": 1, "skipped": 0, "core_blocks": 1}
    hostile_proxy.services.memory.wait()
    exported = send(hostile_proxy, "GET", "/v1/pcp/memory/alice/export", None).text.splitlines()
    assert json.loads(exported[0])["depth"] == 2**63 - 1 and json.loads(exported[-1])["blocks"][0]["id"] == "b1"
    tree = send(hostile_proxy, "GET", f"{SESSION}/components", None).json()["data"]
    assert [c["ttl"] for c in tree] == [2**63 - 1]


def test_components_per_session_is_a_413_naming_the_setting(start_proxy):
    proxy = start_proxy(components_per_session=3)
    for i in range(3):
        assert send(proxy, "POST", f"{SESSION}/components", component(content=f"note {i}", key=f"k{i}")).status_code == 201
    assert send(proxy, "POST", f"{SESSION}/components", component(content="note 0 again", key="k0")).status_code == 201  # replaces its key
    over = send(proxy, "POST", f"{SESSION}/components", component(content="one more"))
    assert over.status_code == 413 and "components_per_session" in over.json()["error"]["message"]


def test_an_import_past_memory_scope_max_pages_is_refused_whole(start_proxy):
    proxy = start_proxy(memory_scope_max_pages=5)
    assert send(proxy, "POST", "/v1/pcp/memory/alice/import", lines(*(page(f"p{i}") for i in range(4)))).json()["imported"] == 4
    assert send(proxy, "POST", "/v1/pcp/memory/alice/import", lines(*(page(f"p{i}") for i in range(4)))).json()["skipped"] == 4  # held: not counted again
    over = send(proxy, "POST", "/v1/pcp/memory/alice/import", lines(*(page(f"q{i}") for i in range(2))))
    assert over.status_code == 413 and "memory_scope_max_pages" in over.json()["error"]["message"]
    proxy.services.memory.wait()
    assert send(proxy, "GET", "/v1/pcp/memory/alice", None).json()["pages"] == 4


def test_a_user_ending_in_a_newline_is_scoped_by_its_hash_and_answered(start_proxy, upstream):
    upstream.default = lambda recorded: completion("Noted.")
    proxy = start_proxy(memory_scope_from_user=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "My bicycle is a green Gazelle."}], "user": "alice\n"}
    answer = proxy.http.post("/v1/chat/completions", json=body, headers=AUTH)
    assert answer.status_code == 200 and answer.headers["x-pcp-memory"].startswith("u-")
    proxy.services.memory.wait()
    assert send(proxy, "GET", f"/v1/pcp/memory/{answer.headers['x-pcp-memory']}", None).json()["pages"] >= 1
    assert send(proxy, "GET", "/v1/pcp/memory/alice", None).json()["pages"] == 0


def test_inline_components_are_held_to_the_same_limits(start_proxy, upstream):
    upstream.default = lambda recorded: completion("Noted.")
    proxy = start_proxy(component_max_kb=1)
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "pcp_components": [component(content="x" * 2000)]}
    answer = proxy.http.post("/v1/chat/completions", json=body, headers={**AUTH, "x-pcp-session": "s2"})
    assert answer.status_code == 413 and "component_max_kb" in answer.json()["error"]["message"]
    assert not upstream.requests  # refused before it went upstream
