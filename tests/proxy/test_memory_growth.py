"""Memory that stays useful as it grows by what it is asked: records, repeats, pages that only ask, metabolism, and
``pending`` 0 meaning searchable (through the proxy; ``PROXY_TEST_STORE=redis`` runs them on the Redis store)."""

from __future__ import annotations

import json
import sqlite3
import threading

from pcp_core.memory import MemoryPolicy, Metabolism
from proxy.memory.sqlite_store import SqliteMemoryStore
from proxy.testing.upstream import StandInEmbedder, completion

from . import helpers
from .helpers import eventually
from .test_memory import KEY, SCOPE, TOLD, scope_status, worker_prompts


def ask(proxy, messages):
    """A chat completion in alice's memory scope, whatever its status (``question`` checks it)."""
    return helpers.ask(proxy, messages, KEY, headers=SCOPE, status=None)


AUTH = {"authorization": "Bearer sk-client"}
P = "/v1/pcp/memory/alice"


def pages(proxy, scope: str = "alice") -> list[dict]:
    return proxy.http.get(f"/v1/pcp/memory/{scope}/pages?limit=200", headers=AUTH).json()["data"]


def question(proxy, text: str):
    response = ask(proxy, [{"role": "user", "content": text}])
    assert response.status_code == 200, response.text
    return response


def test_a_question_about_what_the_scope_holds_is_kept_as_a_record_never_given_to_a_request(start_proxy, upstream):
    proxy = start_proxy()
    ask(proxy, TOLD)
    scope_status(proxy)
    question(proxy, "Where does my sister Beatrix teach cello?")
    status = scope_status(proxy)
    assert status["records"] == 1 and status["pending"] == 0
    listed = {p["content"]: p for p in pages(proxy)}
    assert listed["[user] Where does my sister Beatrix teach cello?"]["record"] is True
    assert not any(p["record"] for text, p in listed.items() if "Lisbon" in text)  # what was told informs
    # A later request is given what was told, never the record of what was asked.
    question(proxy, "Which conservatory does Beatrix teach at?")
    last = worker_prompts(upstream)[-1]
    assert "conservatory there" in last and "Where does my sister Beatrix teach cello" not in last
    # The API's search finds it, after every page that states.
    found = proxy.http.get(f"{P}/pages", params={"query": "Beatrix cello teach"}, headers=AUTH).json()["data"]
    contents = [p["content"] for p in found]
    assert "[user] Where does my sister Beatrix teach cello?" in contents
    assert contents.index("[user] Where does my sister Beatrix teach cello?") > max(i for i, c in enumerate(contents) if "Lisbon" in c)
    # Export marks it; an import keeps it a record.
    exported = proxy.http.get(f"{P}/export", headers=AUTH).text
    marked = [json.loads(line) for line in exported.splitlines() if json.loads(line).get("record")]
    assert {line["content"] for line in marked} >= {"[user] Where does my sister Beatrix teach cello?"}
    assert proxy.http.post("/v1/pcp/memory/bob/import", content=exported, headers=AUTH).status_code == 200
    assert {p["content"] for p in pages(proxy, "bob") if p["record"]} == {line["content"] for line in marked}
    assert proxy.http.get("/v1/pcp/memory/bob/export", headers=AUTH).text == exported


def test_a_scopes_repeated_questions_are_one_page(start_proxy):
    proxy = start_proxy()
    ask(proxy, TOLD)
    scope_status(proxy)
    question(proxy, "Where does my sister Beatrix teach cello?")
    once = scope_status(proxy)
    question(proxy, "where does my sister beatrix teach the cello?")
    question(proxy, "My sister Beatrix, where does she teach cello?")
    again = scope_status(proxy)
    assert again["pages"] == once["pages"]  # three conversations asked it: one page
    assert again["conversations"] == once["conversations"] + 2
    assert sum("teach" in p["content"] and p["content"].startswith("[user]") and "Lisbon" not in p["content"] for p in pages(proxy)) == 1


def test_a_question_the_scope_cannot_answer_stays_but_never_outranks_the_page_that_answers_it(start_proxy):
    proxy = start_proxy()
    ask(proxy, TOLD)
    scope_status(proxy)
    question(proxy, "What is the name of the harbour ferry in Valparaiso?")  # nothing of it in the scope: new words
    scope_status(proxy)
    listed = {p["content"]: p for p in pages(proxy)}
    assert listed["[user] What is the name of the harbour ferry in Valparaiso?"]["record"] is False
    ask(proxy, [{"role": "user", "content": "Last spring I rode the harbour ferry in Valparaiso, it is called the Esmeralda."}])
    scope_status(proxy)
    found = proxy.http.get(f"{P}/pages", params={"query": "name of the harbour ferry in Valparaiso"}, headers=AUTH).json()["data"]
    contents = [p["content"] for p in found]
    assert "Esmeralda" in contents[0]
    assert contents.index("[user] What is the name of the harbour ferry in Valparaiso?") > 0


def test_a_request_ticks_the_scope_pages_consulted_rise_and_the_rest_decay(start_proxy, upstream):
    proxy = start_proxy(context_budget=1024, embedder=StandInEmbedder())
    proxy.services.memory.memory = MemoryPolicy(metabolism=Metabolism(half_life_requests=2))
    long_talk = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Orchard note {i}: the Bramley tree in row {i} needs grafting."} for i in range(40)
    ]
    ask(proxy, long_talk)
    ask(proxy, TOLD)
    before = scope_status(proxy)
    assert before["requests"] == 0 and before["faded"] == 0 and before["consulted"] == 0
    container = next(p for p in pages(proxy) if p["type"] == "Consolidated")
    upstream.enqueue(completion(f'Consult("look", "{container["id"]}")'), completion("done"))
    question(proxy, "Which orchard trees need grafting?")
    for text in ("Anything about Lisbon?", "And the bicycle?", "Which conservatory?"):
        question(proxy, text)
    status = scope_status(proxy)
    assert status["requests"] == 4 and status["consulted"] == 1
    listed = {p["id"]: p for p in pages(proxy)}
    opened = listed[container["id"]]
    assert opened["consulted"] == 1 and opened["idle"] == 3 and opened["recalls"] >= 1 and opened["shown"] >= 1
    told = next(p for p in listed.values() if "Lisbon" in p["content"])
    assert told["idle"] == 4 and told["decay"] > opened["decay"] > 0
    assert status["faded"] >= 1 and status["faded"] == sum(p["idle"] >= 2 for p in listed.values())


def test_when_pending_is_0_what_was_written_is_searchable_with_its_containers(start_proxy):
    """No ``wait()``: the client's own poll of ``pending``. The Memory Consolidator's merge of two alike
    conversations is there as soon as ``pending`` is 0, and every page that informs is in the vector index."""
    proxy = start_proxy(context_budget=1024, embedder=StandInEmbedder())
    for said in ("The tax forms are due before the deadline.", "Grafting apple orchard trees, row by row.", "Grafting apple orchard ladders, row by row."):
        ask(proxy, [{"role": "user", "content": said}])
    status = eventually(lambda: (s := proxy.http.get(P, headers=AUTH).json())["pending"] == 0 and s, timeout=30, interval=0.01, awaiting="pending 0")
    assert status["indexing"] == 0
    merged = [p for p in pages(proxy) if p["type"] == "Consolidated"]  # the two orchard conversations' pages, under one
    assert len(merged) == 1 and len(merged[0]["source_ids"]) == 2 and status["consolidated"] == 1
    memory = proxy.services.memory
    index = memory.indexes[next(iter(memory.indexes))]
    assert index.vectors is not None and len(index.vectors) == status["pages"] - status["records"]


def test_a_status_that_says_pending_0_counts_every_write_done_while_it_was_read(start_proxy, monkeypatch):
    """The write-backs land while a status read is counting: that status cannot say ``pending`` 0 with the counts
    from before them (a gate holds the writer until the first read has counted)."""
    proxy = start_proxy(context_budget=1024, embedder=StandInEmbedder())
    memory, gate = proxy.services.memory, threading.Event()
    memory._submit("", gate.wait, counted=False)
    for said in ("The tax forms are due before the deadline.", "Grafting apple orchard trees, row by row.", "Grafting apple orchard ladders, row by row."):
        ask(proxy, [{"role": "user", "content": said}])
    counts = memory.store.counts

    def counted_as_the_writes_land(scope, *args):
        seen = counts(scope, *args)
        gate.set()
        eventually(lambda: sum(memory.pending.values()) == 0, timeout=30, interval=0.01, awaiting="the write-backs")
        return seen

    monkeypatch.setattr(memory.store, "counts", counted_as_the_writes_land)
    statuses = [proxy.http.get(P, headers=AUTH).json() for _ in range(2)]
    assert statuses[0]["pending"] > 0 and statuses[0]["consolidated"] == 0
    assert statuses[1]["pending"] == 0 and statuses[1]["consolidated"] == 1


def test_a_store_written_before_records_and_metabolism_opens_with_them(tmp_path):
    path = tmp_path / "memory.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE pages(row INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL, id TEXT NOT NULL, container INTEGER NOT NULL,"
        " conversation TEXT NOT NULL, timestamp TEXT NOT NULL, body BLOB NOT NULL, vector BLOB, recalls INTEGER NOT NULL DEFAULT 0, UNIQUE(scope, id));"
    )
    db.close()
    store = SqliteMemoryStore(path)
    try:
        assert store.counts("s") == {
            "originals": 0, "consolidated": 0, "conversations": 0, "forgotten_turns": 0, "records": 0, "requests": 0, "consulted": 0, "faded": 0
        }  # fmt: skip
        columns = {row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(pages)")}
        assert {"record", "shown", "consulted", "used"} <= columns
    finally:
        store.close()


def test_on_a_shared_store_another_process_sees_records_and_use_and_indexing_counts_what_it_has_not_read(start_proxy, redis_server, tmp_path):
    a = start_proxy(store=redis_server.url, data_dir=str(tmp_path / "a"))
    b = start_proxy(store=redis_server.url, data_dir=str(tmp_path / "b"))
    ask(a, TOLD)
    scope_status(a)
    question(a, "Where does my sister Beatrix teach cello?")  # a request: the scope's clock ticks, the question is a record
    scope_status(a)
    assert b.http.get(f"{P}/pages", params={"query": "Lisbon"}, headers=AUTH).status_code == 200  # b's index opens, reads all
    seen = b.http.get(P, headers=AUTH).json()
    assert seen["records"] == 1 and seen["requests"] == 1 and seen["indexing"] == 0
    assert any(p["record"] and p["content"] == "[user] Where does my sister Beatrix teach cello?" for p in pages(b))
    ask(a, [{"role": "user", "content": "My nephew Tomas started school in Porto this autumn."}])
    scope_status(a)
    assert b.http.get(P, headers=AUTH).json()["indexing"] >= 1  # written by a, not read by b yet
    found = b.http.get(f"{P}/pages", params={"query": "Tomas school Porto"}, headers=AUTH).json()["data"]
    assert "Tomas" in found[0]["content"] and b.http.get(P, headers=AUTH).json()["indexing"] == 0
