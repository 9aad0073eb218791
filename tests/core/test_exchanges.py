"""The other APIs' conversations read as chat messages: a call and its result one turn, reasoning opaque."""

from __future__ import annotations

from pcp_core import Conversation, ScanPolicy, anthropic_messages, message_text, responses_messages
from pcp_core.exchanges import Call, Part, Result, Said, chat_messages, text_part

from .counting import COUNT


def texts(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], message_text(m)) for m in messages]


def test_a_result_joins_the_turn_whose_call_it_answers():
    said = [
        Said("user", [Part(text_part("Weather in Paris?"))]),
        Said("assistant", [Part(text_part("Let me look.")), Call("c1", "get_weather", '{"city": "Paris"}')]),
        Said("tool", [Result("c1", [text_part("22 C, sunny")])]),
        Said("assistant", [Part(text_part("It is sunny."))]),
    ]
    assert texts(chat_messages(said)) == [
        ("user", "Weather in Paris?"),
        ("assistant", 'Let me look. (calls get_weather({"city": "Paris"})) (get_weather returned: 22 C, sunny)'),
        ("assistant", "It is sunny."),
    ]


def test_parallel_calls_keep_their_results_in_order_and_a_users_words_after_them_stay_the_users():
    said = [
        Said("assistant", [Call("a", "read", '"x"'), Call("b", "read", '"y"')]),
        Said("user", [Result("b", [text_part("Y")]), Result("a", [text_part("X")], error=True), Part(text_part("and hurry"))]),
    ]
    assert texts(chat_messages(said)) == [
        ("assistant", '(calls read("x")) (calls read("y")) (read returned: Y) (read failed: X)'),
        ("user", "and hurry"),
    ]


def test_a_result_whose_call_is_not_in_the_conversation_is_a_tool_turn_of_its_own():
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    messages = chat_messages([Said("tool", [Result("gone", [text_part("done"), image])])])
    assert messages == [{"role": "tool", "content": [text_part("(a tool returned: done)"), image]}]


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
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]}
    call = {"type": "function_call", "call_id": "c", "name": "look", "arguments": "{}"}
    again = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Still here."}]}
    assert texts(responses_messages(None, [reasoning, said, call, again])) == [("assistant", "Looking. (calls look({}))"), ("assistant", "Still here.")]
