"""Anthropic's context editing rules (``pcp_core.context_edits``), without a server."""

from __future__ import annotations

import pytest

from pcp_core import after_compaction, apply_edits, edits_of
from pcp_core.context_edits import CLEARED, EditError


def count(text: str) -> int:
    return len(text.split())


def history(n: int, names: tuple[str, ...] = ("read",)) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": "go"}]
    for i in range(n):
        name = names[i % len(names)]
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": name, "input": {"path": f"f{i}"}}]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "word " * 10}]})
    return messages


def results(messages: list[dict]) -> list[str]:
    return [b["content"] for m in messages if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"]


def test_all_but_the_kept_tool_uses_are_cleared_over_the_trigger():
    edited = apply_edits(history(6), [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 50}}], 100, count)
    assert results(edited.messages) == [CLEARED] * 3 + ["word " * 10] * 3
    assert edited.applied == [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3, "cleared_input_tokens": 30}]


def test_below_the_trigger_nothing_is_cleared():
    edited = apply_edits(history(6), [{"type": "clear_tool_uses_20250919"}], 99_999, count)
    assert edited.applied == [] and edited.messages == history(6)


def test_keep_exclude_inputs_and_a_tool_uses_trigger():
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 3},
        "keep": {"type": "tool_uses", "value": 1},
        "exclude_tools": ["write"],
        "clear_tool_inputs": ["read"],
    }
    edited = apply_edits(history(6, ("read", "write")), [edit], 0, count)
    cleared = results(edited.messages)
    assert cleared[0] == cleared[2] == CLEARED and cleared[1] != CLEARED and cleared[4] != CLEARED  # the last read is kept
    assert edited.messages[1]["content"][0]["input"] == {} and edited.messages[3]["content"][0]["input"] == {"path": "f1"}
    assert edited.applied[0]["cleared_tool_uses"] == 2


def test_clear_at_least_holds_an_edit_that_clears_too_little():
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1}, "clear_at_least": {"type": "input_tokens", "value": 1000}}
    assert apply_edits(history(6), [edit], 100, count).applied == []


def test_thinking_of_all_but_the_last_turns_is_cleared():
    messages = history(3)
    for i in (1, 3, 5):
        messages[i]["content"].insert(0, {"type": "thinking", "thinking": "hmm " * 4, "signature": "s"})
    edited = apply_edits(messages, [{"type": "clear_thinking_20251015"}], 0, count)
    assert edited.applied == [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 2, "cleared_input_tokens": 8}]
    assert [len(m["content"]) for m in edited.messages if m["role"] == "assistant"] == [1, 1, 2]
    assert apply_edits(messages, [{"type": "clear_thinking_20251015", "keep": "all"}], 0, count).applied == []


def test_compaction_fires_over_its_trigger():
    edits = [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}, "pause_after_compaction": True}]
    assert apply_edits(history(1), edits, 50_000, count).compaction is None
    assert apply_edits(history(1), edits, 50_001, count).compaction.pause_after_compaction


def test_what_precedes_a_compaction_block_is_dropped():
    block = {"type": "compaction", "content": "summary", "encrypted_content": "handle"}
    messages = [*history(2), {"role": "assistant", "content": [block, {"type": "text", "text": "so"}]}, {"role": "user", "content": "next"}]
    held, after = after_compaction(messages)
    assert held == "handle" and after == [{"role": "assistant", "content": [{"type": "text", "text": "so"}]}, {"role": "user", "content": "next"}]
    assert after_compaction(history(2)) == (None, history(2))


@pytest.mark.parametrize("said", [{"edits": [{"type": "shred"}]}, {"edits": "all"}, [], {"edits": [{"type": "compact_20260112", "trigger": 5}]}])
def test_an_edit_that_cannot_be_read_says_where(said):
    with pytest.raises(EditError):
        edits_of(said)
