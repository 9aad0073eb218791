"""Hybrid v3 mode through the real proxy: a scripted model that writes snapshots of every shape, streamed and not."""

from __future__ import annotations

import json

import pytest

from pcp_core.hybrid import SEPARATOR
from proxy.testing.upstream import Reply, completion, metric_value, stream_reply

from .hybrid_helpers import API, COUNT, KEY, PINNED, answered, block, model, shown, stored, violations, with_memory


@pytest.fixture
def hybrid(start_proxy):
    return start_proxy(hybrid="enabled")


# -- the switch -------------------------------------------------------------------------------


def test_off_nothing_changes(proxy, upstream):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, indent=1).encode()
    upstream.enqueue(completion(f"hello {SEPARATOR} {{}}"))
    response = proxy.http.post("/v1/chat/completions", content=body, headers={**PINNED, "content-type": "application/json", "x-pcp-context-mode": "enabled"})
    assert upstream.requests[-1].body == body and SEPARATOR in response.json()["choices"][0]["message"]["content"]
    assert "x-pcp-context-round" not in response.headers
    assert proxy.http.get(f"{API}/context", headers=KEY).json()["error"]["code"] == "hybrid_off"


def test_disabled_by_default_a_request_opts_in_and_an_enabled_proxy_lets_one_opt_out(start_proxy, upstream):
    proxy = start_proxy(hybrid="disabled")
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    upstream.enqueue(completion("plain"))
    proxy.http.post("/v1/chat/completions", content=body, headers={**PINNED, "content-type": "application/json"})
    assert upstream.requests[-1].body == body
    upstream.enqueue(model("on", with_memory(core=[block("c1")])))
    assert answered(proxy, "hi", {**PINNED, "x-pcp-context-mode": "enabled"})[0] == "on"
    upstream.enqueue(completion(f'off\n{SEPARATOR}\n{{"memory": {{}}}}'))  # the model writes one though told not to
    text, headers = answered(proxy, "hi", {**PINNED, "x-pcp-context-mode": "disabled"})
    assert text == "off" and "contextMode = disabled" in upstream.requests[-1].json["messages"][0]["content"]
    assert "x-pcp-context-round" not in headers and stored(proxy).runtime.round == 1 and violations(proxy, "context_while_disabled") == 1
    response = proxy.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]}, headers={**PINNED, "x-pcp-context-mode": "sometimes"}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "x-pcp-context-mode"


# -- what the proxy owns --------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_the_snapshot_rides_every_round_and_the_client_sees_only_the_answer(hybrid, upstream, stream):
    upstream.enqueue(model("Noted: you grow tomatoes.", with_memory(core=[block("c1", content="grows tomatoes")]), stream=stream))
    headers = {**PINNED, "x-pcp-workspace": "/srv//garden/./plots"}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "I grow tomatoes."}]
    text, response_headers = answered(hybrid, messages, headers, stream=stream)
    assert text == "Noted: you grow tomatoes." and response_headers["x-pcp-context-round"] == "1"
    system = upstream.requests[-1].json["messages"][0]["content"]
    assert system.startswith("Be brief.\n\nContext Protocol, Hybrid mode") and SEPARATOR in system
    first = shown(upstream.requests[-1])
    assert first["version"] == 3.0 and first["runtime"]["round"] == 1 and first["runtime"]["workspace"] == "/srv/garden/plots/"
    assert first["runtime"]["datetime"].endswith("Z") and first["runtime"]["startup_at"] > 1_700_000_000_000
    assert [b.content for b in stored(hybrid).memory.core] == ["grows tomatoes"]
    upstream.enqueue(model("Yes.", stream=stream))
    text, response_headers = answered(
        hybrid, [*messages, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Do I?"}], PINNED, stream=stream
    )
    second = shown(upstream.requests[-1])
    assert second["runtime"]["round"] == 2 and second["runtime"]["startup_at"] == first["runtime"]["startup_at"]
    assert second["runtime"]["workspace"] == "/srv/garden/plots/"  # kept from the session's last naming of it
    assert [b["id"] for b in second["memory"]["core"]] == ["c1"] and response_headers["x-pcp-context-round"] == "2"


@pytest.mark.parametrize("stream", [False, True])
def test_the_systems_fields_are_restored_and_a_bad_cursor_is_not_taken(hybrid, upstream, stream):
    def meddle(snapshot):
        todo = {**snapshot["todo"], "summary": "all done!", "step": 9, "cursor": {"v": 1, "phase": "doing", "next": "todo_complete", "targetId": None}}
        return {**snapshot, "version": 4, "runtime": {**snapshot["runtime"], "round": 77, "workspace": "/etc/"}, "todo": todo}

    upstream.enqueue(model("Done.", meddle, stream=stream))
    assert answered(hybrid, "go", stream=stream)[0] == "Done."
    snapshot = stored(hybrid)
    assert (snapshot.version, snapshot.runtime.round, snapshot.runtime.workspace, snapshot.todo.summary, snapshot.todo.cursor) == (3.0, 1, "", "no todo", None)
    assert violations(hybrid, "system_field") == 5 and violations(hybrid, "cursor") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_blocks_that_break_the_rules_are_dropped_and_duplicates_merged(hybrid, upstream, stream):
    missing = {k: v for k, v in block("no-content").items() if k != "content"}
    core = [block("good"), block("hot", decay=1.5), missing, block("twice", confidence=0.5), block("twice", confidence=0.8, content="better")]
    upstream.enqueue(model("ok", with_memory(core=core), stream=stream))
    answered(hybrid, "go", stream=stream)
    assert [(b.id, b.content) for b in stored(hybrid).memory.core] == [("good", "content of good"), ("twice", "better")]
    assert (violations(hybrid, "block_range"), violations(hybrid, "block_missing_field"), violations(hybrid, "duplicate_id")) == (1, 1, 1)


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_without_a_usable_snapshot_keeps_the_previous_one(hybrid, upstream, stream):
    upstream.enqueue(model("first", with_memory(core=[block("keep-me")]), stream=stream))
    answered(hybrid, "one", stream=stream)
    for reply, rule in (
        (model("not json", context='{"memory": oops', stream=stream), "not_json"),
        (stream_reply(["no section at all"]) if stream else completion("no section at all"), "no_context"),
    ):
        upstream.enqueue(reply)
        text, _ = answered(hybrid, "again", stream=stream)
        assert SEPARATOR not in text and "oops" not in text
        assert [b.id for b in stored(hybrid).memory.core] == ["keep-me"] and violations(hybrid, rule) == 1
    assert stored(hybrid).runtime.round == 3  # the rounds went on all the same


@pytest.mark.parametrize("stream", [False, True])
def test_two_separators_the_last_section_is_read(hybrid, upstream, stream):
    last = json.dumps({"memory": {"core": [block("from-the-last")]}})
    upstream.enqueue(model("Answer", context=f'{{"memory": {{}}}}\n{SEPARATOR}\n{last}', stream=stream))
    assert answered(hybrid, "go", stream=stream)[0] == "Answer"
    assert [b.id for b in stored(hybrid).memory.core] == ["from-the-last"] and violations(hybrid, "separators") == 1


def test_a_separator_split_across_chunks_never_reaches_the_client(hybrid, upstream):
    text = f"Tomatoes need sun. <b>Water</b> them < daily.\n{SEPARATOR}\n" + json.dumps({"memory": {"working": [block("w1")]}})
    cuts = ["Tomatoes need sun. <", "b>Water</b> them <", " daily.\n<", "<<CONT", "EXT", ">>", ">\n{", text[text.index("{") + 1 :]]
    assert "".join(cuts) == text
    upstream.enqueue(stream_reply(cuts))
    assert answered(hybrid, "go", stream=True)[0] == "Tomatoes need sun. <b>Water</b> them < daily."
    assert [b.id for b in stored(hybrid).memory.working] == ["w1"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_that_only_calls_tools_owes_no_section(hybrid, upstream, stream):
    call = [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}]
    if stream:
        event = {
            "id": "x",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, **call[0]}]}, "finish_reason": None}],
        }
        done = {**event, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        upstream.enqueue(
            Reply(headers={"content-type": "text/event-stream"}, chunks=[f"data: {json.dumps(e)}\n\n".encode() for e in (event, done)] + [b"data: [DONE]\n\n"])
        )
    else:
        upstream.enqueue(completion(tool_calls=call))
    response = hybrid.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "look it up"}], "stream": stream}, headers=PINNED
    )
    assert response.status_code == 200 and "look" in response.text
    assert violations(hybrid, "no_context") == 0 and stored(hybrid).runtime.round == 1


# -- which session ------------------------------------------------------------------------------


def test_a_conversation_that_names_no_session_is_recognised_by_its_messages(hybrid, upstream):
    upstream.enqueue(model("Hello!", with_memory(core=[block("name", content="Ada")])))
    _, headers = answered(hybrid, "Hi, I am Ada.", KEY)
    session = headers["x-pcp-session"]
    upstream.enqueue(model("Ada.", stream=True))
    _, again = answered(
        hybrid,
        [{"role": "user", "content": "Hi, I am Ada."}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Who am I?"}],
        KEY,
        stream=True,
    )
    assert again["x-pcp-session"] == session and again["x-pcp-context-round"] == "2"
    assert [b["content"] for b in shown(upstream.requests[-1])["memory"]["core"]] == ["Ada"]
    upstream.enqueue(model("New here?"))
    _, other = answered(hybrid, "A different conversation.", KEY)
    assert other["x-pcp-session"] != session and other["x-pcp-context-round"] == "1"
    assert stored(hybrid, f"/v1/pcp/sessions/{session}").runtime.round == 2


@pytest.mark.embedded_store
def test_sessions_are_the_callers_and_their_text_is_sealed_on_disk(start_proxy, upstream, tmp_path):
    proxy = start_proxy(hybrid="enabled", data_key="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
    upstream.enqueue(model("ok", with_memory(core=[block("secret", content="zanzibarquokka")])))
    answered(proxy, "go")
    assert proxy.http.get(f"{API}/context", headers={"authorization": "Bearer sk-two"}).json()["error"]["code"] == "session_not_found"
    proxy.stop()
    on_disk = b"".join(p.read_bytes() for p in (tmp_path / "data" / "context").rglob("*") if p.is_file())
    assert on_disk and b"zanzibarquokka" not in on_disk


# -- the todo list, and the lifecycle -----------------------------------------------------------


def test_the_todo_projection_is_the_systems_and_working_blocks_last_the_task(hybrid, upstream):
    todo = {"items": [{"id": 1, "title": "plan", "done": True}, {"id": 2, "title": "build"}, {"id": 3, "title": "check"}]}
    answer = hybrid.http.put(f"{API}/todo", json=todo, headers=KEY)
    assert answer.status_code == 200 and (answer.json()["summary"], answer.json()["step"]) == ("in progress 1/3 (step 2)", 2)
    cursor = {"v": 1, "phase": "doing", "next": "todo_complete", "targetId": 2, "note": "build it"}
    upstream.enqueue(model("Building.", lambda s: {**with_memory(working=[block("w")])(s), "todo": {**s["todo"], "cursor": cursor}}))
    answered(hybrid, "go")
    assert shown(upstream.requests[-1])["todo"] == {"summary": "in progress 1/3 (step 2)", "total": 3, "step": 2}
    assert stored(hybrid).todo.cursor.targetId == 2
    hybrid.http.put(f"{API}/todo", json={"items": [{**item, "done": True} for item in todo["items"]]}, headers=KEY)
    upstream.enqueue(model("All done."))
    answered(hybrid, "and now?")
    assert shown(upstream.requests[-1])["memory"]["working"] == [] and shown(upstream.requests[-1])["todo"]["summary"] == "done"
    assert hybrid.http.get(f"{API}/todo", headers=KEY).json()["total"] == 3
    for bad, param in (
        ({"items": [{"id": 0, "title": "x"}]}, "items.[0].id"),
        ({"items": [{"id": 1, "title": "a"}, {"id": 1, "title": "b"}]}, "items"),
        ({"items": [{"id": 1, "title": "a", "why": 1}]}, "items.[0]"),
    ):
        refused = hybrid.http.put(f"{API}/todo", json=bad, headers=KEY)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text


def test_a_snapshot_over_its_share_keeps_its_weakest_blocks_cold_until_a_query_names_their_tags(start_proxy, upstream):
    proxy = start_proxy(hybrid="enabled", context_budget=4096)
    blocks = [block(f"l{i}", confidence=0.5 + i / 50, tags=[f"topic{i}"], content=f"reusable knowledge {i}: " + "compost and mulch " * 30) for i in range(12)]
    upstream.enqueue(model("Noted.", with_memory(longterm=blocks)))
    answered(proxy, "remember all this")
    upstream.enqueue(model("Ok."))
    answered(proxy, "anything else?")
    longterm = {b["id"]: b for b in shown(upstream.requests[-1])["memory"]["longterm"]}
    placeholders = [b for b in longterm.values() if b.get("content_state") == "tag_ref"]
    assert placeholders and all(b["content"] == "" and b["tag_summary"].startswith("reusable knowledge") for b in placeholders)
    assert "l0" not in longterm or longterm["l0"].get("content_state") == "tag_ref"  # the weakest went first (shelved, past the placeholders)
    assert longterm["l11"]["content"] == blocks[11]["content"]  # the best stays
    assert COUNT(upstream.requests[-1].json["messages"][0]["content"]) <= 4096 // 4 + 8
    upstream.enqueue(model("Here it is."))
    answered(proxy, "what do we know about topic0?")
    l0 = next(b for b in shown(upstream.requests[-1])["memory"]["longterm"] if b["id"] == "l0")
    assert l0["content"] == blocks[0]["content"] and l0.get("content_state", "active") == "active" and l0["rehydrated_at"]
    exposition = proxy.http.get("/metrics").text
    assert metric_value(exposition, "pcp_context_cold_total", event="sent") >= 1 and metric_value(exposition, "pcp_context_cold_total", event="rehydrated") == 1


def test_violations_are_named_in_the_log_at_debug(hybrid, upstream, caplog):
    upstream.enqueue(model("ok", with_memory(core=[block("hot", decay=1.5)])))
    with caplog.at_level("DEBUG", logger="pcp.hybrid"):
        answered(hybrid, "go")
    assert any("memory.core[0]: decay 1.5 is outside [0, 1]" in r.getMessage() for r in caplog.records)
    assert metric_value(hybrid.http.get("/metrics").text, "pcp_context_rounds_total", outcome="read") == 1


# -- with a memory scope, core blocks outlive their session ------------------------------------


def test_with_a_memory_scope_core_blocks_outlive_their_session(hybrid, upstream):
    scoped = {**KEY, "x-pcp-memory": "team"}
    upstream.enqueue(model("Noted.", with_memory(core=[block("pref", content="metric units")])))
    answered(hybrid, "I use metric units.", {**scoped, "x-pcp-session": "one"})
    upstream.enqueue(model("Hi."))
    answered(hybrid, "Hello", {**scoped, "x-pcp-session": "two"})
    assert [b["content"] for b in shown(upstream.requests[-1])["memory"]["core"]] == ["metric units"]
    for headers in ({**KEY, "x-pcp-session": "three"}, {"authorization": "Bearer sk-two", "x-pcp-memory": "team", "x-pcp-session": "four"}):
        upstream.enqueue(model("Hi."))
        answered(hybrid, "Hello", headers)  # no scope, or another caller's scope of the same name: nothing shared
        assert shown(upstream.requests[-1])["memory"]["core"] == []


def test_sessions_of_one_scope_add_to_its_core_and_a_block_the_model_lets_fade_is_gone(hybrid, upstream):
    scoped = {**KEY, "x-pcp-memory": "team"}
    upstream.enqueue(model("a", with_memory(core=[block("units", content="metric units")])))
    answered(hybrid, "one", {**scoped, "x-pcp-session": "one"})
    upstream.enqueue(model("b", with_memory(core=[block("units", content="metric units"), block("tz", content="times in UTC")])))
    answered(hybrid, "two", {**scoped, "x-pcp-session": "two"})
    upstream.enqueue(model("c", with_memory(core=[block("units", decay=0.95)])))  # shown both, it lets units fade (rule 14)
    answered(hybrid, "three", {**scoped, "x-pcp-session": "three"})
    upstream.enqueue(model("d"))
    answered(hybrid, "four", {**scoped, "x-pcp-session": "four"})
    assert [b["id"] for b in shown(upstream.requests[-1])["memory"]["core"]] == ["tz"]


def test_a_block_one_session_drops_from_the_scope_does_not_come_back_from_another_sessions_snapshot(hybrid, upstream):
    scoped = {**KEY, "x-pcp-memory": "team"}
    upstream.enqueue(model("a", with_memory(core=[block("units", content="metric units"), block("tz", content="times in UTC")])))
    answered(hybrid, "one", {**scoped, "x-pcp-session": "one"})  # session one's snapshot holds units, as the scope does
    upstream.enqueue(model("b", with_memory(core=[block("units", decay=0.95), block("tz", content="times in UTC")])))  # shown both, it lets units fade
    answered(hybrid, "two", {**scoped, "x-pcp-session": "two"})
    upstream.enqueue(model("c"))  # session one again: its own snapshot still holds units
    answered(hybrid, "one again", {**scoped, "x-pcp-session": "one"})
    assert [b["id"] for b in shown(upstream.requests[-1])["memory"]["core"]] == ["tz"]
    upstream.enqueue(model("d"))
    answered(hybrid, "three", {**scoped, "x-pcp-session": "three"})
    assert [b["id"] for b in shown(upstream.requests[-1])["memory"]["core"]] == ["tz"]
    upstream.enqueue(model("e"))
    answered(hybrid, "one, no scope", {**KEY, "x-pcp-session": "one"})  # without its scope, the session's own core is its own
    assert [b["id"] for b in shown(upstream.requests[-1])["memory"]["core"]] == ["tz"]


def test_the_scopes_core_travels_with_its_export(hybrid, upstream):
    scoped = {**KEY, "x-pcp-memory": "team"}
    upstream.enqueue(model("Noted.", with_memory(core=[block("units", content="metric units")])))
    answered(hybrid, "I use metric units.", {**scoped, "x-pcp-session": "one"})
    hybrid.services.memory.wait()
    exported = hybrid.http.get("/v1/pcp/memory/team/export", headers=KEY).content
    last = json.loads(exported.splitlines()[-1])
    assert last["type"] == "Core" and [b["content"] for b in last["blocks"]] == ["metric units"]
    imported = hybrid.http.post("/v1/pcp/memory/moved/import", content=exported, headers=KEY).json()
    assert imported["core_blocks"] == 1 and imported["imported"] >= 1
    upstream.enqueue(model("Hi."))
    answered(hybrid, "Hello", {**KEY, "x-pcp-memory": "moved", "x-pcp-session": "two"})
    assert [b["content"] for b in shown(upstream.requests[-1])["memory"]["core"]] == ["metric units"]
    bad = hybrid.http.post("/v1/pcp/memory/moved/import", content=b'{"type": "Core", "blocks": [{"id": 3}]}\n', headers=KEY)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "line 1"
    refused = exported.replace(
        b'"Core","blocks":[{', b'"Core","blocks":[{"id":"tz","type":"fact","decay":0.0,"confidence":1.0,"round":1,"tags":[],"content":"times in UTC"},{', 1
    )
    refused += (
        b'{"type":"Consolidated","id":"c-x","origin":"Storage","depth":1,"timestamp":"2026-01-01T00:00","keywords":[],"summary":"s","source_ids":["nowhere"]}\n'
    )
    assert hybrid.http.post("/v1/pcp/memory/elsewhere/import", content=refused, headers=KEY).status_code == 400
    upstream.enqueue(model("Hi."))
    answered(hybrid, "Hello", {**KEY, "x-pcp-memory": "elsewhere", "x-pcp-session": "three"})
    assert shown(upstream.requests[-1])["memory"]["core"] == []  # a refused import keeps none of its blocks


@pytest.mark.embedded_store
def test_the_scopes_core_is_kept_on_disk_sealed_and_dropped_with_the_scope(start_proxy, upstream, tmp_path):
    settings = {"hybrid": "enabled", "data_dir": str(tmp_path), "data_key": "a" * 64}
    scoped = {**KEY, "x-pcp-memory": "team"}
    first = start_proxy(**settings)
    upstream.enqueue(model("Noted.", with_memory(core=[block("pref", content="prefers tabs")])))
    answered(first, "I prefer tabs.", {**scoped, "x-pcp-session": "one"})
    first.stop()
    stored_bytes = b"".join(path.read_bytes() for path in (tmp_path / "memory" / "core").rglob("*") if path.is_file())
    assert stored_bytes and b"prefers tabs" not in stored_bytes
    again = start_proxy(**settings)
    upstream.enqueue(model("Hi."))
    answered(again, "Hello", {**scoped, "x-pcp-session": "two"})
    assert [b["content"] for b in shown(upstream.requests[-1])["memory"]["core"]] == ["prefers tabs"]
    assert again.http.delete("/v1/pcp/memory/team", headers=KEY).status_code == 200
    upstream.enqueue(model("Hi."))
    answered(again, "Hello", {**scoped, "x-pcp-session": "three"})
    assert shown(upstream.requests[-1])["memory"]["core"] == []
