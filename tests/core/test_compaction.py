"""An agent's own compaction: known by its prompt, answered with the task, the latest turns and a handle to the pages."""

from __future__ import annotations

from pcp_core import Conversation, asks_to_compact, compaction_text, marked_handles
from pcp_core.pages.blocks import ScanPolicy

from .counting import COUNT as count


def conversation(*messages: dict) -> Conversation:
    return Conversation.of(list(messages), ScanPolicy(), count)


HISTORY = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in calc/ops.py (ticket CALC-17)."},
    {"role": "assistant", "content": "Reading the file."},
    {"role": "user", "content": "def add_totals(first, second): return first - second"},
    {"role": "assistant", "content": "The bug is the minus sign."},
]
CLAUDE = {"role": "user", "content": "Your task is to create a detailed summary of the conversation so far, paying close attention to the user's requests."}


def test_a_compaction_is_known_by_its_prompt_and_needs_a_history():
    assert asks_to_compact(conversation(*HISTORY, CLAUDE))
    assert asks_to_compact(conversation(*HISTORY, {"role": "user", "content": "You are performing a CONTEXT CHECKPOINT COMPACTION."}))
    assert not asks_to_compact(conversation(*HISTORY, {"role": "user", "content": "Summarise what we did."}))
    assert not asks_to_compact(conversation(HISTORY[0], CLAUDE))  # nothing before it to compact


def test_the_answer_holds_the_task_the_latest_turns_and_the_handle():
    text = compaction_text(conversation(*HISTORY, CLAUDE), "pcp-pages.v1.abc.def", count)
    assert "[pcp-pages: pcp-pages.v1.abc.def]" in text and "4 messages" in text
    assert "ticket CALC-17" in text.split("The latest turns:")[0]  # the task, as first given
    assert text.rstrip().endswith("assistant: The bug is the minus sign.")  # the latest turn last
    assert marked_handles(f"{text} and again {text} [pcp-pages: other.one]") == ["pcp-pages.v1.abc.def", "other.one"]


def test_a_long_history_is_cut_to_its_latest_turns():
    long = [HISTORY[0], HISTORY[1], *({"role": "user" if i % 2 else "assistant", "content": f"turn {i} " + "word " * 300} for i in range(40))]
    text = compaction_text(conversation(*long, CLAUDE), "h", count)
    latest = text.split("The latest turns:")[1]
    assert "turn 39" in latest and "turn 2 " not in latest
    assert count(latest) <= 1600
