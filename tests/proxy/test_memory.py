"""Memory across conversations, through the proxy: scopes, write-back, the page fault, the API, isolation, forgetting."""

from __future__ import annotations

import json

from proxy.testing.upstream import StandInEmbedder, completion
from tests.proxy.helpers import ask

SCOPE = {"x-pcp-memory": "alice"}
KEY = "sk-client"  # as the openai SDK of ``RunningProxy.client`` sends it
TOLD = [
    {"role": "user", "content": "My sister Beatrix moved to Lisbon in March, she teaches cello at the conservatory there."},
    {"role": "assistant", "content": "That sounds wonderful for her."},
    {"role": "user", "content": "Also my bicycle is a green Gazelle from 1987."},
]


def scope_status(proxy, headers=SCOPE, api_key="sk-client"):
    """The scope's status (its pages, Originals, …) once memory's writer has stored what it was handed."""
    proxy.services.memory.wait()
    auth = {"authorization": f"Bearer {api_key}"}
    return proxy.http.get(f"/v1/pcp/memory/{headers['x-pcp-memory']}", headers=auth).json()


def worker_prompts(upstream):
    return [r.json["messages"][0]["content"] for r in upstream.requests if r.headers.get("x-pcp-role") == "worker"]


def test_a_request_without_a_scope_is_never_remembered(start_proxy, upstream):
    proxy = start_proxy()
    response = ask(proxy, TOLD, KEY)
    assert response.headers["x-pcp-mode"] == "passthrough" and "x-pcp-memory" not in response.headers
    proxy.services.memory.wait()
    assert set(proxy.services.memory.store.counts("").values()) == {0}
    assert not any(proxy.services.memory.store.listing(key, 0, 1) for key in ("", "x"))


def test_a_malformed_scope_is_a_400_naming_the_header(start_proxy):
    response = ask(start_proxy(), TOLD, KEY, headers={"x-pcp-memory": "no spaces/allowed"}, status=400)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-pcp-memory"


def test_what_a_forwarded_conversation_said_reaches_a_new_one_as_storage_pages(start_proxy, upstream):
    proxy = start_proxy()
    first = ask(proxy, TOLD, KEY, headers=SCOPE)
    assert first.headers["x-pcp-mode"] == "passthrough" and first.headers["x-pcp-memory"] == "alice"
    status = scope_status(proxy)
    assert status["pending"] == 0 and status["originals"] >= 1 and status["conversations"] == 1
    assert "x-pcp-memory" not in upstream.requests[-1].headers  # ours, never the upstream's

    reply = ask(proxy, [{"role": "user", "content": "Where does my sister Beatrix teach cello?"}], KEY, headers=SCOPE)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-pcp-mode"] == "protocol"  # a page fault, far below the threshold
    prompt = worker_prompts(upstream)[0]
    assert 'origin="Storage"' in prompt and "conservatory" in prompt


def test_a_resent_conversation_adds_nothing_twice(start_proxy):
    proxy = start_proxy()
    ask(proxy, TOLD, KEY, headers=SCOPE)
    once = scope_status(proxy)
    ask(proxy, TOLD, KEY, headers=SCOPE)
    ask(proxy, [*TOLD, {"role": "assistant", "content": "A classic bike."}, {"role": "user", "content": "It has a new bell."}], KEY, headers=SCOPE)
    again = scope_status(proxy)
    assert again["conversations"] == once["conversations"] == 1
    texts = [p["content"] for p in proxy.http.get("/v1/pcp/memory/alice/pages?limit=200", headers={"authorization": "Bearer sk-client"}).json()["data"]]
    assert sum("Beatrix moved to Lisbon" in t for t in texts) == 1


def test_another_key_sees_nothing_of_a_scope_of_the_same_name(start_proxy, upstream):
    proxy = start_proxy()
    ask(proxy, TOLD, "sk-alice", headers=SCOPE)
    assert scope_status(proxy, api_key="sk-alice")["originals"] >= 1
    assert scope_status(proxy, api_key="sk-mallory")["pages"] == 0
    reply = ask(proxy, [{"role": "user", "content": "Where does my sister Beatrix teach cello?"}], "sk-mallory", headers=SCOPE)
    assert reply.headers["x-pcp-mode"] == "passthrough"
    assert "Lisbon" not in json.dumps(upstream.requests[-1].json)


def test_a_forgotten_text_does_not_come_back_when_its_conversation_is_sent_again(start_proxy, upstream):
    proxy = start_proxy()
    auth = {"authorization": "Bearer sk-client"}
    ask(proxy, TOLD, KEY, headers=SCOPE)
    scope_status(proxy)
    forgotten = proxy.http.post("/v1/pcp/memory/alice/forget", json={"query": "Gazelle bicycle"}, headers=auth).json()["forgotten"]
    assert forgotten
    ask(proxy, TOLD, KEY, headers=SCOPE)
    ask(proxy, [*TOLD, {"role": "assistant", "content": "Nice."}, {"role": "user", "content": "Thanks."}], KEY, headers=SCOPE)
    scope_status(proxy)
    exported = proxy.http.get("/v1/pcp/memory/alice/export", headers=auth).text
    assert "Gazelle" not in exported and "Beatrix" in exported


def test_forgetting_by_id_takes_the_page_out_of_search_and_of_its_containers(start_proxy):
    proxy = start_proxy()
    auth = {"authorization": "Bearer sk-client"}
    ask(proxy, TOLD, KEY, headers=SCOPE)
    scope_status(proxy)
    found = proxy.http.get("/v1/pcp/memory/alice/pages", params={"query": "Lisbon cello"}, headers=auth).json()["data"]
    target = next(p for p in found if "Lisbon" in p.get("content", ""))
    assert proxy.http.delete(f"/v1/pcp/memory/alice/pages/{target['id']}", headers=auth).json()["deleted"] == [target["id"]]
    assert proxy.http.get(f"/v1/pcp/memory/alice/pages/{target['id']}", headers=auth).status_code == 404
    after = proxy.http.get("/v1/pcp/memory/alice/pages", params={"query": "Lisbon cello"}, headers=auth).json()["data"]
    assert all("Lisbon" not in json.dumps(p) for p in after)


def test_export_and_import_keep_the_tree(start_proxy):
    proxy = start_proxy(context_budget=1024)
    auth = {"authorization": "Bearer sk-client"}
    long_talk = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i} about the orchard, apple variety number {i}, pruning and grafting notes."}
        for i in range(60)
    ]
    ask(proxy, long_talk, KEY, headers=SCOPE)
    status = scope_status(proxy)
    assert status["consolidated"] >= 1
    exported = proxy.http.get("/v1/pcp/memory/alice/export", headers=auth).content
    lines = [json.loads(line) for line in exported.splitlines()]
    seen: set[str] = set()
    for page in lines:  # a container after the pages it holds
        assert all(child in seen for child in page.get("source_ids", []))
        seen.add(page["id"])
    imported = proxy.http.post("/v1/pcp/memory/bob/import", content=exported, headers=auth).json()
    assert imported == {"imported": len(lines), "skipped": 0, "core_blocks": 0}
    assert proxy.http.get("/v1/pcp/memory/bob/export", headers=auth).content == exported
    bad = proxy.http.post("/v1/pcp/memory/bob/import", content=b'{"type": "Original", "id": 3}\n', headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "line 1"


def test_pages_are_listed_with_a_cursor_and_errors_use_the_envelope(start_proxy):
    proxy = start_proxy()
    auth = {"authorization": "Bearer sk-client"}
    ask(proxy, TOLD, KEY, headers=SCOPE)
    ask(proxy, [{"role": "user", "content": "The plumber comes on Tuesday at nine."}], KEY, headers=SCOPE)
    scope_status(proxy)
    first = proxy.http.get("/v1/pcp/memory/alice/pages?limit=1", headers=auth).json()
    assert len(first["data"]) == 1 and first["next_cursor"]
    second = proxy.http.get(f"/v1/pcp/memory/alice/pages?limit=1&cursor={first['next_cursor']}", headers=auth).json()
    assert second["data"][0]["id"] != first["data"][0]["id"]
    wrong = proxy.http.get("/v1/pcp/memory/alice/pages?limit=lots", headers=auth)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "limit"
    assert proxy.http.get("/v1/pcp/memory/alice/pages/nope", headers=auth).json()["error"]["code"] == "page_not_found"


def test_the_body_user_names_the_scope_when_the_setting_asks(start_proxy):
    proxy = start_proxy(memory_scope_from_user=True)
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": TOLD, "user": "ann@example.com"}, headers={"authorization": "Bearer k"})
    scope = response.headers["x-pcp-memory"]
    assert scope.startswith("u-")
    proxy.services.memory.wait()
    assert proxy.http.get(f"/v1/pcp/memory/{scope}", headers={"authorization": "Bearer k"}).json()["originals"] >= 1


def test_a_consult_on_a_memory_container_opens_its_pages(start_proxy, upstream):
    proxy = start_proxy(context_budget=1024, embedder=StandInEmbedder())
    long_talk = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Orchard note {i}: the Bramley tree in row {i} needs grafting."} for i in range(40)
    ]
    ask(proxy, long_talk, KEY, headers=SCOPE)
    scope_status(proxy)
    containers = [
        p for p in proxy.http.get("/v1/pcp/memory/alice/export", headers={"authorization": "Bearer sk-client"}).text.splitlines() if '"Consolidated"' in p
    ]
    target = json.loads(containers[-1])
    upstream.enqueue(completion(f'Consult("look", "{target["id"]}")'), completion(f'Consult("open", "{target["id"]}")'), completion("done"))
    reply = ask(proxy, [{"role": "user", "content": "Which orchard trees need grafting?"}], KEY, headers=SCOPE)
    assert reply.status_code == 200
    last = worker_prompts(upstream)[-1]
    assert f'<Node id="{target["id"]}" type="Consolidated" view="Unpacked" origin="Storage"' in last
    assert all(f'<Node id="{child}"' in last for child in target["source_ids"])


def test_the_indexes_are_built_again_when_their_files_are_gone(start_proxy, tmp_path):
    proxy = start_proxy(embedder=StandInEmbedder())
    ask(proxy, TOLD, KEY, headers=SCOPE)
    scope_status(proxy)
    proxy.stop()
    for saved in (tmp_path / "data" / "memory" / "index").rglob("*"):
        if saved.is_file():
            saved.unlink()
    again = start_proxy(embedder=StandInEmbedder())
    found = again.http.get("/v1/pcp/memory/alice/pages", params={"query": "cello Lisbon"}, headers={"authorization": "Bearer sk-client"}).json()["data"]
    assert any("Lisbon" in p.get("content", "") for p in found)


def test_the_memory_api_wants_the_proxy_key_when_one_is_set(start_proxy):
    proxy = start_proxy(api_keys=["sk-proxy"])
    assert proxy.http.get("/v1/pcp/memory/alice").json()["error"]["code"] == "missing_api_key"
    assert proxy.http.get("/v1/pcp/memory/alice", headers={"authorization": "Bearer sk-proxy"}).json()["pages"] == 0


def test_a_router_model_reads_memory_candidates_as_the_memory_router(start_proxy, upstream):
    proxy = start_proxy(router_model="picker")
    ask(proxy, TOLD, KEY, headers=SCOPE)
    scope_status(proxy)
    ask(proxy, [{"role": "user", "content": "Where does my sister Beatrix teach cello?"}], KEY, headers=SCOPE)
    roles = [r.headers.get("x-pcp-role") for r in upstream.requests]
    assert "memory-router" in roles
    asked = next(r for r in upstream.requests if r.headers.get("x-pcp-role") == "memory-router")
    assert asked.json["model"] == "picker" and "Beatrix" in asked.json["messages"][-1]["content"]
