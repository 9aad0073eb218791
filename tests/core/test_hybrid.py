"""Hybrid v3 mode's rules, no server: the snapshot read against the rules, the separator, the lifecycle."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from pcp_core.hybrid import (
    SEPARATOR,
    AgingPolicy,
    Block,
    Cold,
    LimitsPolicy,
    Memory,
    RoundFacts,
    SeparatorGate,
    Snapshot,
    TodoItem,
    age,
    check,
    context_prompt,
    fit,
    kept_cold,
    parse_context,
    read_snapshot,
    rehydrate,
    render,
    scope_core,
    split_answer,
    system_snapshot,
    this_round,
    with_system_text,
)

from .counting import COUNT

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
    written = snapshot_json(
        version=4.0, runtime={"round": 99, "workspace": "/elsewhere", "datetime": "then", "startup_at": 5}, todo={"summary": "all done!", "total": 1, "step": 1}
    )
    reading = read_snapshot(written, owned, owned)
    assert reading.snapshot.runtime == owned.runtime and reading.snapshot.version == 3.0
    assert (reading.snapshot.todo.summary, reading.snapshot.todo.total, reading.snapshot.todo.step) == ("in progress 0/3 (step 1)", 3, 1)
    assert {str(v).split(" ")[0] for v in reading.violations} >= {"version", "runtime.round", "runtime.workspace", "todo.summary", "todo.total"}


def test_blocks_that_break_the_rules_are_dropped_and_named():
    limits_breakers = [block("hi-decay", decay=1.5), block("neg", confidence=-0.1), block("stale", decay=0.95), block("unsure", confidence=0.05)]
    missing = {k: v for k, v in block("no-tags").items() if k != "tags"}
    written = snapshot_json(memory={"core": [block("good"), missing, *limits_breakers, "not a block"], "scratch": []})
    reading = read_snapshot(written, system(), system())
    assert [b.id for b in reading.snapshot.memory.core] == ["good"]
    assert len(reading.violations) == 7  # six blocks and one tier that is not a tier
    assert any("missing tags" in str(v) for v in reading.violations) and any("memory.scratch" in str(v) for v in reading.violations)


def test_blocks_merge_by_id_and_each_tier_keeps_its_best_first():
    previous = read_snapshot(snapshot_json(memory={"working": [block("w1", confidence=0.5), block("w2")]}), system(), system()).snapshot
    written = snapshot_json(memory={"working": [block("w1", confidence=0.99, content="updated")], "longterm": [block("w2", confidence=0.6)]})
    memory = read_snapshot(written, previous, system()).snapshot.memory
    assert [(b.id, b.content) for b in memory.working] == [("w1", "updated")]  # w2 moved to longterm, not kept twice
    assert [b.id for b in memory.longterm] == ["w2"]
    ranked = read_snapshot(
        snapshot_json(memory={"core": [block("low", confidence=0.3), block("high", confidence=0.95)]}), system(), system()
    ).snapshot.memory.core
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
    assert split_answer(f'Done.\n\n{SEPARATOR}\n{{"a": 1}}') == ("Done.", '{"a": 1}', 1)
    assert split_answer("No snapshot here, <b> and << are text.") == ("No snapshot here, <b> and << are text.", None, 0)
    visible, context, separators = split_answer(f'Hi {SEPARATOR} {{}} {SEPARATOR} {{"b": 2}}')
    assert (visible, context, separators) == ("Hi", '{"b": 2}', 2)


@given(st.text(alphabet="ab <>{}\n:", max_size=40), st.lists(st.integers(1, 12), max_size=8), st.booleans())
def test_however_an_answer_is_chunked_the_client_never_sees_the_snapshot(answer, cuts, with_snapshot):
    reply = answer + (f'\n{SEPARATOR}\n{{"k": "{SEPARATOR[:5]}"}}' if with_snapshot else "")
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
    snapshot = msgspec.structs.replace(system(round=1), memory=memory)
    later = age(snapshot, current=3, aging=AgingPolicy(ephemeral_rounds=3))
    assert later.memory.core[0].decay > 0.1 and later.memory.working[0].decay > later.memory.core[0].decay
    assert [b.id for b in later.memory.ephemeral] == ["e"]
    assert age(snapshot, current=4, aging=AgingPolicy(ephemeral_rounds=3)).memory.ephemeral == ()
    assert age(snapshot, current=2, task_done=True).memory.working == ()
    assert age(snapshot, current=400).memory.core == ()  # faded past the limit


def test_a_snapshot_that_outgrows_its_room_sends_its_weakest_blocks_cold_and_a_query_brings_them_back():
    blocks = tuple(
        Block(id=f"l{i}", type="t", decay=0.1, confidence=0.5 + i / 100, round=1, tags=(f"topic{i}",), content=f"long reusable knowledge number {i} " * 20)
        for i in range(10)
    )
    snapshot = msgspec.structs.replace(system(), memory=Memory(longterm=blocks))
    room = COUNT(render(snapshot)) * 2 // 3
    fitted, cold = fit(snapshot, room, COUNT)
    assert COUNT(render(fitted)) <= room and cold.payloads and not cold.shelved
    placeholders = [b for b in fitted.memory.longterm if b.content_state == "tag_ref"]
    assert placeholders and placeholders[0].id == "l0"  # the weakest first
    assert all(b.tag_id in cold.payloads and b.content == "" for b in placeholders)
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


# -- what the rules added for the proxy --------------------------------------------------------


def test_an_id_written_twice_keeps_the_better_block_and_a_faded_rewrite_takes_its_old_self_away():
    previous = read_snapshot(snapshot_json(memory={"core": [block("old"), block("keep")]}), system(), system()).snapshot
    written = snapshot_json(
        memory={
            "working": [block("w", confidence=0.4), block("w", confidence=0.8, content="better"), block("w", confidence=0.5)],
            "core": [block("old", decay=0.99)],
        }
    )
    reading = read_snapshot(written, previous, system())
    assert [(b.id, b.content) for b in reading.snapshot.memory.working] == [("w", "better")]
    assert [b.id for b in reading.snapshot.memory.core] == ["keep"]  # "old" faded: gone, not left as it was
    assert sorted(v.rule for v in reading.violations) == ["block_quality", "duplicate_id", "duplicate_id"]
    assert not check(reading.snapshot)


def test_placeholders_are_the_systems_and_rounds_cannot_run_ahead():
    cold_block = Block(
        id="l", type="t", decay=0.1, confidence=0.9, round=1, tags=("x",), content="", content_state="tag_ref", tag_id="tag-1", tag_summary="about x"
    )
    previous = msgspec.structs.replace(system(), memory=Memory(longterm=(cold_block,)))
    forged = block("f", content_state="tag_ref", tag_id="tag-9", content="")
    rewritten = {**msgspec.to_builtins(cold_block), "tag_summary": "changed", "tags": ["y"]}
    reading = read_snapshot(snapshot_json(memory={"longterm": [rewritten, forged], "core": [block("future", round=99)]}), previous, system())
    assert reading.snapshot.memory.longterm == (cold_block,)  # kept as the system made it
    assert reading.snapshot.memory.core[0].round == 3
    assert sorted(v.rule for v in reading.violations) == ["block_round", "placeholder"]
    back = read_snapshot(snapshot_json(memory={"longterm": [block("l", content="whole again", tag_id="tag-1")]}), previous, system()).snapshot
    assert back.memory.longterm[0].content_state == "active" and back.memory.longterm[0].tag_id is None


def test_a_tier_keeps_at_most_its_limit_of_blocks_the_best():
    many = [block(f"b{i}", confidence=0.3 + i / 100) for i in range(10)]
    reading = read_snapshot(snapshot_json(memory={"ephemeral": many}), system(), system(), LimitsPolicy(max_blocks=4))
    assert [b.id for b in reading.snapshot.memory.ephemeral] == ["b9", "b8", "b7", "b6"] and reading.violations[-1].rule == "too_many"


def test_decay_rises_once_per_round_however_often_the_model_writes_its_block_back():
    snapshot = msgspec.structs.replace(
        system(round=1), memory=Memory(core=(Block(id="c", type="t", decay=0.1, confidence=0.9, round=1, tags=(), content="x"),))
    )
    step_by_step = snapshot
    for current in range(2, 6):  # each round the model copies the aged block back, round unchanged
        step_by_step = msgspec.structs.replace(age(step_by_step, current), runtime=msgspec.structs.replace(step_by_step.runtime, round=current))
    at_once = age(snapshot, 5)
    assert abs(step_by_step.memory.core[0].decay - at_once.memory.core[0].decay) < 1e-3
    assert age(snapshot, 1) == snapshot  # the round it was made in: nothing changes


def test_a_context_section_is_read_from_bare_json_and_repaired_where_it_can_be():
    assert parse_context('{"a": 1}') == ({"a": 1}, [])
    fenced, problems = parse_context('```json\n{"a": 1}\n```')
    assert fenced == {"a": 1} and [p.rule for p in problems] == ["not_bare_json"]
    assert parse_context('{"a": 1} and some words')[0] == {"a": 1}
    for broken in ("not json", '{"a": NaN}', '{"a": '):
        assert parse_context(broken)[0] is None and parse_context(broken)[1][-1].rule == "not_json"
    assert parse_context(None)[1][0].rule == "no_context" and parse_context("{}", separators=2)[1][0].rule == "separators"


def test_a_round_ages_the_snapshot_brings_back_what_the_query_asks_and_fits_the_rest():
    blocks = tuple(
        Block(id=f"l{i}", type="t", decay=0.1, confidence=0.5 + i / 100, round=1, tags=(f"topic{i}",), content=f"long reusable knowledge number {i} " * 20)
        for i in range(10)
    )
    start = msgspec.structs.replace(system(round=1), memory=Memory(longterm=blocks))
    room = COUNT(render(start)) // 2
    facts = RoundFacts(round=2, workspace="/w/", now=NOW, startup_at=1, todo=(TodoItem(1, "a"),), query="hello")
    shown, cold = this_round(start, facts, Cold(), room, COUNT)
    assert shown.runtime.round == 2 and COUNT(render(shown)) <= room and cold.payloads and not check(shown)
    asked = msgspec.structs.replace(facts, round=3, query="and topic0?")
    again, cold_again = this_round(shown, asked, cold, room, COUNT)
    l0 = next(b for b in again.memory.longterm if b.id == "l0")
    assert l0.content_state == "active" and l0.rehydrated_at == again.runtime.datetime  # asked for: back, and kept warm this round
    named = {b.tag_id for _, b in again.memory.blocks() if b.tag_id} | {s.block.tag_id for s in cold_again.shelved}
    assert set(cold_again.payloads) == named and not check(again)


def test_placeholders_that_do_not_fit_are_shelved_and_still_come_back():
    blocks = tuple(
        Block(id=f"l{i}", type="t", decay=0.1, confidence=0.5 + i / 100, round=1, tags=(f"topic{i}",), content=f"knowledge {i} " * 40) for i in range(12)
    )
    snapshot = msgspec.structs.replace(system(round=1), memory=Memory(longterm=blocks))
    room = COUNT(render(system(round=1))) + 60  # room for a placeholder or so, not twelve
    fitted, cold = fit(snapshot, room, COUNT)
    assert COUNT(render(fitted)) <= room and len(cold.shelved) >= 10 and cold.shelved[0].block.id == "l0"
    back = rehydrate(fitted, "topic0 please", cold, "now")
    assert next(b for b in back.memory.longterm if b.id == "l0").content == blocks[0].content
    assert all(s.block.id != "l0" for s in kept_cold(back, cold).shelved)


# -- a memory scope's core ------------------------------------------------------------------


def _block(id: str, **fields) -> Block:
    return msgspec.convert(block(id, **fields), Block)


def test_a_scopes_core_keeps_what_a_round_kept_and_what_it_never_saw_and_drops_what_it_left_out():
    stored = (_block("seen-kept"), _block("seen-dropped"), _block("written-meanwhile"))
    kept = (_block("seen-kept", content="rewritten"), _block("new", confidence=0.99))
    merged = scope_core(stored, kept, seen={"seen-kept", "seen-dropped"})
    assert [(b.id, b.content) for b in merged] == [("new", "content of new"), ("seen-kept", "rewritten"), ("written-meanwhile", "content of written-meanwhile")]
    assert len(scope_core(stored, [_block(f"b{i}") for i in range(10)], seen=(), limits=LimitsPolicy(max_blocks=4))) == 4


def test_a_block_the_session_gave_its_scope_that_the_scope_no_longer_holds_leaves_the_session_too():
    facts = RoundFacts(round=3, workspace="", now=NOW, startup_at=1_700_000_000_000)
    mine = msgspec.structs.replace(system(round=2), memory=Memory(core=(_block("dropped-elsewhere"), _block("never-given"), _block("kept"))))
    shown, _ = this_round(mine, facts, Cold(), 2000, COUNT, shared_core=[_block("kept")], given={"dropped-elsewhere", "kept"})
    assert sorted(b.id for b in shown.memory.core) == ["kept", "never-given"]
    shown, _ = this_round(mine, facts, Cold(), 2000, COUNT, given={"dropped-elsewhere", "kept"})  # the scope holds none now
    assert sorted(b.id for b in shown.memory.core) == ["never-given"]


def test_a_shared_core_block_written_at_a_later_round_of_another_session_joins_this_round_as_its_own():
    facts = RoundFacts(round=2, workspace="", now=NOW, startup_at=1_700_000_000_000)
    shown, _ = this_round(None, facts, Cold(), 2000, COUNT, shared_core=[_block("from-elsewhere", round=40)])
    assert [(b.id, b.round) for b in shown.memory.core] == [("from-elsewhere", 2)] and check(shown) == []
