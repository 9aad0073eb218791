"""A conversation's pieces folded into chat messages: a call and its result one turn."""

from __future__ import annotations

from pcp_core import message_text
from pcp_core.exchanges import Call, Part, Result, Said, chat_messages, text_part


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
