"""An agent's own compaction through the proxy, with the official SDKs: answered from the pages with no model call,
in each API's shape, and the summary it hands back reads those pages into every later request."""

from __future__ import annotations

from proxy.testing.upstream import completion

PROMPT = "Your task is to create a detailed summary of the conversation so far, paying close attention to the user's explicit requests."
TASK = "Fix the failing test of the ledger package."


def history(turns: int = 30) -> list[dict]:
    """A task, then tool output turns; turn 3 holds a detail no later turn repeats."""
    messages: list[dict] = [{"role": "user", "content": TASK}]
    for i in range(turns):
        detail = "The ledger's rounding mode is BANKERS-HALF-EVEN, set in ledger/config.py." if i == 3 else ""
        messages.append({"role": "assistant", "content": f"Step {i}: reading part {i} of the notes."})
        messages.append({"role": "user", "content": f"Part {i} of the notes: " + " ".join(f"entry{i}x{k} balance" for k in range(150)) + " " + detail})
    return messages


def test_a_compaction_is_answered_from_the_pages_and_the_summary_reads_them_later(start_proxy, upstream):
    proxy = start_proxy(translate_apis="always")  # a chat-completions upstream
    upstream.default = completion("BANKERS-HALF-EVEN")
    client = proxy.anthropic()
    messages = [*history(), {"role": "user", "content": PROMPT}]
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=1000, system="You are a coding agent.", messages=messages) as stream:
        summary = stream.get_final_message()
        headers = stream.response.headers
    assert headers["x-pcp-mode"] == "protocol" and upstream.requests == []  # no model call
    assert headers["x-pcp-mode-reason"] == "agent-compaction"
    text = summary.content[0].text
    assert "[pcp-pages: " in text and TASK in text and "BANKERS" not in text  # the detail is in the pages, not the summary
    # The agent goes on from the summary alone, as Claude Code does; the detail reaches the model from the pages.
    later = [{"role": "user", "content": f"This session is being continued from a previous conversation.\n\n{text}"}, {"role": "assistant", "content": "OK."}]
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=[*later, {"role": "user", "content": "Which rounding mode does the ledger use?"}]
    )
    assert raw.headers["x-pcp-mode"] == "protocol" and raw.parse().content[0].text == "BANKERS-HALF-EVEN"
    (worker,) = upstream.chat_requests("worker")
    assert "BANKERS-HALF-EVEN" in str(worker.json["messages"])


def test_chat_and_responses_get_the_summary_in_their_own_shape(start_proxy, upstream):
    proxy = start_proxy()
    client = proxy.client()
    messages = [*history(5), {"role": "user", "content": "You are performing a CONTEXT CHECKPOINT COMPACTION. Summarize."}]
    chat = client.chat.completions.with_raw_response.create(model="gpt-5", messages=messages)
    assert chat.headers["x-pcp-mode"] == "protocol" and "[pcp-pages: " in chat.parse().choices[0].message.content
    response = client.responses.create(model="gpt-5", input=messages)
    assert "[pcp-pages: " in response.output_text
    assert upstream.requests == []


def test_a_marker_of_another_caller_opens_nothing_and_off_forwards_the_compaction(start_proxy, upstream):
    proxy = start_proxy()
    upstream.default = completion("done")
    client = proxy.client()
    messages = [*history(5), {"role": "user", "content": PROMPT}]
    made = client.chat.completions.create(model="gpt-5", messages=messages).choices[0].message.content
    other = proxy.client(api_key="sk-another-caller")
    carried = [{"role": "user", "content": made}, {"role": "user", "content": "And now?"}]
    raw = other.chat.completions.with_raw_response.create(model="gpt-5", messages=carried)
    assert raw.status_code == 200 and raw.headers["x-pcp-mode"] == "passthrough"  # text like any other: no pages behind it
    off = client.chat.completions.with_raw_response.create(model="gpt-5", messages=messages, extra_headers={"x-pcp-mode-request": "off"})
    assert off.headers["x-pcp-mode"] == "passthrough" and off.parse().choices[0].message.content == "done"
