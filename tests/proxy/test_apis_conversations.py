"""The Responses and Messages conversations read as chat messages: a call and its result one turn, reasoning opaque."""

from __future__ import annotations

from pcp_core import Conversation, ScanPolicy, message_text
from proxy.apis.messages import anthropic_messages
from proxy.apis.responses import responses_messages

from ..core.counting import COUNT

TASK = "The unit tests fail. Find and fix the bug in the calc package."


def texts(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], message_text(m)) for m in messages]


def read(messages: list[dict]) -> Conversation:
    return Conversation.of(messages, ScanPolicy(), COUNT)


def test_a_system_message_after_the_last_turn_joins_the_head_and_the_users_task_stays_the_query():
    # Claude Code's first request: its system prompt, the task after a reminder, then a
    # mid-conversation system message (the agent types its Agent tool can start).
    messages = anthropic_messages(
        [{"type": "text", "text": "You are Claude Code."}],
        [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>be brief</system-reminder>"}, {"type": "text", "text": TASK}]},
            {"role": "system", "content": "Available agent types for the Agent tool: general-purpose, Explore."},
        ],
    )
    conversation = read(messages)
    assert TASK in conversation.query_text
    assert "Available agent types" not in conversation.query_text
    assert "Available agent types" in conversation.head_text and "You are Claude Code." in conversation.head_text
    assert conversation.history == []


def test_responses_items_read_as_turns_reasoning_left_out():
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "SECRET"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "22 C"},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Sunny, 22 C.", "annotations": []}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Thanks"}, {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}],
        },
    ]
    messages = responses_messages("Be brief.", items)
    shown = texts(messages)
    assert shown[0] == ("system", "Be brief.")
    assert shown[1:3] == [("user", "Weather in Paris?"), ("assistant", '(calls get_weather({"city":"Paris"})) (get_weather returned: 22 C)')]
    assert shown[3] == ("assistant", "Sunny, 22 C.")
    assert shown[4][1].startswith("Thanks [input_image ")
    assert "SECRET" not in str(messages)
    conversation = Conversation.of(messages, ScanPolicy(), COUNT)
    assert conversation.head_text == "Be brief." and conversation.query["role"] == "user"


def test_the_same_items_are_the_same_messages_whatever_their_ids_and_statuses():
    """A follow-up sends back what the last answer said: the session must find it as it was."""
    first = [{"role": "assistant", "content": "Hello"}]
    again = [
        {"type": "message", "role": "assistant", "id": "msg_9", "status": "completed", "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}
    ]
    assert texts(responses_messages(None, first)) == texts(responses_messages(None, again))


def test_anthropic_blocks_read_as_turns_thinking_left_out_marks_dropped():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Read a.py", "cache_control": {"type": "ephemeral"}}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "PRIVATE", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a.py"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "print(1)"}]}]},
        {
            "role": "user",
            "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}, "cache_control": {"type": "ephemeral"}}],
        },
    ]
    chat = anthropic_messages([{"type": "text", "text": "You code."}], messages)
    assert texts(chat)[:3] == [
        ("system", "You code."),
        ("user", "Read a.py"),
        ("assistant", '(calls read_file({"path": "a.py"})) (read_file returned: print(1))'),
    ]
    assert "PRIVATE" not in str(chat) and "cache_control" not in str(chat)
    assert chat[-1]["content"][0]["type"] == "image"


def test_one_response_is_one_turn_and_two_messages_are_two():
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]}
    call = {"type": "function_call", "call_id": "c", "name": "look", "arguments": "{}"}
    again = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Still here."}]}
    assert texts(responses_messages(None, [reasoning, message, call, again])) == [("assistant", "Looking. (calls look({}))"), ("assistant", "Still here.")]
