"""A request's messages read as head, history and query, as coding agents send them."""

from __future__ import annotations

import json

from pcp_core import Conversation, ScanPolicy, message_text
from pcp_core.conversation import query_shown

from .counting import COUNT

TASK = "The unit tests fail. Find and fix the bug in the calc package."


def read(messages: list[dict]) -> Conversation:
    return Conversation.of(messages, ScanPolicy(), COUNT)


def test_a_system_message_between_turns_stays_in_the_history():
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "first"},
        {"role": "system", "content": "Mind the budget."},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
    ]
    conversation = read(messages)
    assert conversation.query_text == "second"
    assert [m["content"] for m in conversation.history] == ["first", "Mind the budget.", "ok"]


def call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_a_chat_query_of_tool_results_carries_the_calls_that_asked_for_them():
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": TASK},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [call("c1", "read", {"filePath": "calc/ops.py"}), call("c2", "bash", {"command": "ls"})],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "def add_totals(a, b): return a - b"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "calc tests"}]},
    ]
    conversation = read(messages)
    assert conversation.history == [messages[1]]
    assert conversation.query_text == (
        'Let me look.\n(calls read({"filePath": "calc/ops.py"}))\n(calls bash({"command": "ls"})) '
        "(read returned: def add_totals(a, b): return a - b) (bash returned: calc tests)"
    )
    assert not conversation.query_is_block


def test_the_turn_of_a_tool_result_keeps_its_attachments():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        {"role": "user", "content": "look at the screen"},
        {"role": "assistant", "content": None, "tool_calls": [call("s", "screenshot", {})]},
        {"role": "tool", "tool_call_id": "s", "content": [{"type": "text", "text": "taken"}, image]},
    ]
    conversation = read(messages)
    assert conversation.query_parts == [image]
    assert "(screenshot returned: taken [image_url" in conversation.query_text


def test_a_tool_result_too_large_for_a_prompt_stays_the_message_it_came_as():
    big = "\n".join(f"line {i}: the ledger entry {i * 37} of the quarter" for i in range(3000))
    messages = [
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "read", {"filePath": "big.txt"})]},
        {"role": "tool", "tool_call_id": "c1", "content": big},
    ]
    conversation = read(messages)
    assert conversation.query_is_block and conversation.query == messages[-1]
    assert conversation.history == messages[:2]


def test_tool_results_whose_call_is_not_there_stay_the_query_alone():
    messages = [{"role": "user", "content": "go"}, {"role": "tool", "tool_call_id": "gone", "content": "done"}]
    conversation = read(messages)
    assert conversation.query == messages[-1] and conversation.history == messages[:1]
    assert message_text(conversation.query) == "done"


def test_what_a_client_sent_before_is_the_history_up_to_its_latest_answer():
    chat = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "fine"},
        {"role": "user", "content": "third"},
    ]
    assert read(chat).sent_before == 3  # "first", "ok", "second": the request before ended with "second"
    assert read(chat[:2]).sent_before == 0  # a conversation's first request: nothing was sent before it
    tools = [
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "bash", {"command": "ls"})]},
        {"role": "tool", "tool_call_id": "c1", "content": "calc tests"},
    ]
    conversation = read(tools)
    assert conversation.sent_before == len(conversation.history) == 1  # the calls and results are this request's answer


def test_a_long_query_is_shown_whole_where_the_budget_holds_it():
    output = "Output of the command:\n" + "\n".join(f"line {i}: the ledger balance of account {i} is {i * 37}" for i in range(120))
    messages = [{"role": "user", "content": "Run it."}, {"role": "assistant", "content": "Running."}, {"role": "user", "content": output}]
    assert COUNT(output) > ScanPolicy().block_tokens  # longer than a page holds
    assert Conversation.of(messages, ScanPolicy(), COUNT).query_is_block  # paged apart where nothing says more fits
    shown = query_shown(16_384)
    assert COUNT(output) <= shown and not Conversation.of(messages, ScanPolicy(), COUNT, shown).query_is_block
    assert Conversation.of(messages, ScanPolicy(), COUNT, query_shown(2048)).query_is_block  # past half a small budget
