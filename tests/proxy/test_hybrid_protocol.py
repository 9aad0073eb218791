"""Hybrid v3 mode in protocol mode, and however an answer is chunked, through the real proxy."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from pcp_core import prompt_tokens
from pcp_core.hybrid import SEPARATOR
from pcp_core.prompt.document import USER_LINE
from proxy.testing.apis import worker_document, worker_text
from proxy.testing.upstream import Recorded, Reply, completion, stream_reply
from tests.proxy.helpers import BUDGET, long_history

from .hybrid_helpers import COUNT, KEY, answered, block, model, shown, stored, violations, with_memory

# -- protocol mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_in_protocol_mode_the_snapshot_follows_the_paged_context_within_the_budget(start_proxy, upstream, stream):
    proxy = start_proxy(hybrid="enabled", sentry_threshold=500, context_budget=BUDGET)
    upstream.enqueue(model("The code is 5521.", with_memory(working=[block("w", content="asked for the code")]), stream=stream))
    text, headers = answered(proxy, long_history(), KEY, stream=stream)
    assert text == "The code is 5521." and headers["x-pcp-mode"] == "protocol" and headers["x-pcp-context-round"] == "1"
    worker = upstream.chat_requests("worker")[-1]
    said = worker_text(worker)
    assert said.startswith("Turn 0: ") and said.index("</PagedContext>") < said.index("Context Protocol, Hybrid mode") < said.index(USER_LINE)
    assert prompt_tokens(worker.json["messages"], COUNT) <= BUDGET
    session = headers["x-pcp-session"]
    assert [b.id for b in stored(proxy, f"/v1/pcp/sessions/{session}").memory.working] == ["w"]
    upstream.enqueue(model("Sure.", stream=stream))
    _, follow = answered(proxy, [*long_history(), {"role": "assistant", "content": text}, {"role": "user", "content": "Thanks!"}], KEY, stream=stream)
    assert follow["x-pcp-session"] == session and shown(upstream.chat_requests("worker")[-1])["runtime"]["round"] == 2


def test_a_section_written_in_a_round_of_directives_is_kept_when_the_answer_has_none(start_proxy, upstream):
    proxy = start_proxy(hybrid="enabled", sentry_threshold=500, context_budget=BUDGET)

    def consult(recorded: Recorded) -> Reply:
        document = worker_document(recorded).split("\n\nContext Protocol, Hybrid mode")[0]
        page = next(node.get("id") for node in etree.fromstring(document).iter("Node"))
        return completion(f'Consult("look closer", "{page}")\n{SEPARATOR}\n' + json.dumps({"memory": {"core": [block("from-round-0")]}}))

    upstream.enqueue(consult, completion("It is 5521."))
    text, headers = answered(proxy, long_history(), KEY)
    assert text == "It is 5521." and headers["x-pcp-rounds"] == "2"
    assert [b.id for b in stored(proxy, f"/v1/pcp/sessions/{headers['x-pcp-session']}").memory.core] == ["from-round-0"]
    assert violations(proxy, "no_context") == 0


def test_a_conversation_that_outgrows_the_threshold_keeps_its_snapshot(start_proxy, upstream):
    proxy = start_proxy(hybrid="enabled", sentry_threshold=500, context_budget=BUDGET)
    opening = long_history()[:16]  # below the threshold, ending with a user's turn
    upstream.enqueue(model("Hi.", with_memory(core=[block("me", content="likes gardens")])))
    _, below = answered(proxy, opening, KEY)
    upstream.enqueue(model("Lovely."))
    pasted = {"role": "user", "content": "My garden diary: " + "watered the beans, weeded the onions. " * 60}
    _, above = answered(proxy, [*opening, {"role": "assistant", "content": "Hi."}, pasted], KEY)
    assert (below["x-pcp-mode"], above["x-pcp-mode"], above["x-pcp-context-round"]) == ("passthrough", "protocol", "2")
    assert [b["id"] for b in shown(upstream.chat_requests("worker")[-1])["memory"]["core"]] == ["me"]


# -- chunkings, through the proxy ---------------------------------------------------------------

SEARCH = os.environ.get("FUZZ_EXAMPLES")
EXAMPLES = settings(max_examples=int(SEARCH or 25), derandomize=SEARCH is None, deadline=None, suppress_health_check=list(HealthCheck))
SECTIONS = st.sampled_from([
    json.dumps({"memory": {"core": [block("c")], "working": [block("w", decay=1.5)]}}),
    json.dumps({"runtime": {"round": 99}, "memory": {"ephemeral": [block("e"), block("e", confidence=0.3)]}}),
    '{"memory": {"core": [{"id": "x"}]}}', "not json at all", f'{{}}\n{SEPARATOR}\n{{"active_task": "t"}}',
    '```json\n{"active_task": "fenced"}\n```',
])  # fmt: skip


@EXAMPLES
@given(
    answer=st.text(alphabet='ab <>{}\n:"', max_size=30),
    section=SECTIONS,
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    with_section=st.booleans(),
    stream=st.booleans(),
    paged=st.booleans(),
)
def test_however_the_answer_is_chunked_the_client_never_sees_the_section_and_the_kept_snapshot_holds(
    start_proxy, upstream, answer, section, sizes, with_section, stream, paged
):
    # One proxy for every example: the session goes on from one to the next, as a conversation's does.
    proxy = getattr(upstream, "hybrid_proxy", None) or start_proxy(hybrid="enabled", sentry_threshold=500, context_budget=BUDGET)
    upstream.hybrid_proxy = proxy

    def cut(text: str) -> list[str]:
        out, at, i = [], 0, 0
        while at < len(text):
            out.append(text[at : at + sizes[i % len(sizes)]])
            at, i = at + sizes[i % len(sizes)], i + 1
        return out

    full = f"{answer}\n{SEPARATOR}\n{section}" if with_section else answer
    upstream.enqueue(stream_reply(cut(full)) if stream else completion(full))
    text, headers = answered(proxy, long_history() if paged else "go", stream=stream)
    assert headers["x-pcp-mode"] == ("protocol" if paged else "passthrough")
    assert SEPARATOR not in text and "memory" not in text and "active_task" not in text
    if not paged:  # in protocol mode the answer gate also takes markup out of the text
        assert text == answer.rstrip()
    stored(proxy)
