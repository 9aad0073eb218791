"""The round loop driven by a scripted worker: next()/send(), no server."""

from __future__ import annotations

import json
import re

import pytest
from lxml import etree

from pcp_core.directives.answers import NO_ANSWER
from pcp_core.directives.replies import DIRECTIVE_TOOLS, WorkerReply
from pcp_core.directives.vocabulary import Consult
from pcp_core.directives.zooming import diffuse as _diffuse
from pcp_core.engine import _priorities, run_rounds
from pcp_core.pages.views import ViewState
from pcp_core.paging.history import retroactive_paging, turns_from_messages
from pcp_core.prompt.markup import node_type, node_view
from pcp_core.round_policy import RoundContext, RoundPolicy
from pcp_core.text.tokens import prompt_tokens

from .counting import COUNT
from .helpers import paged, two_level_tree


def history():
    messages = []
    for i in range(240):
        text = f"Small talk number {i} about the garden and the weather."
        if i == 50:
            text = "My sister Ingrid adopted a greyhound named Biscuit in April 2021."
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


DIFFUSION_PAGES = RoundPolicy().diffusion_pages


def context(**overrides) -> RoundContext:
    """A request's context; the RoundPolicy's fields among ``overrides`` go to its policy."""
    policy = {"budget": 2048, "max_rounds": 4, **{k: overrides.pop(k) for k in list(overrides) if k in RoundPolicy.__struct_fields__}}
    fields = {"query": "What is the name of Ingrid's greyhound?", "current_time": "2026-11-22T10:00:00", **overrides}
    return RoundContext(**fields, policy=RoundPolicy(**policy))


def drive(replies, ctx=None, messages=None):
    """Run the engine against scripted replies; returns (calls, outcome)."""
    index = retroactive_paging(turns_from_messages(messages or history(), "2026-11-22T09:00:00"), COUNT)
    loop = run_rounds(ctx or context(), index, COUNT)
    calls = [next(loop)]
    replies = list(replies)
    while True:
        reply = replies.pop(0)
        if callable(reply):
            reply = reply(calls[-1])
        try:
            calls.append(loop.send(reply))
        except StopIteration as done:
            return calls, done.value, index


def doc(call):
    return etree.fromstring(paged(call.messages))


def summary_node_ids(call):
    return [n.get("id") for n in doc(call).iter("Node") if node_view(n) == "Summary"]


def test_a_plain_answer_ends_the_loop_in_one_round():
    calls, outcome, _ = drive([WorkerReply(text="Biscuit.")])
    assert len(calls) == 1 and outcome.kind == "answer"
    assert outcome.text == "Biscuit." and outcome.rounds == 1


def test_round_zero_injects_the_routed_evidence():
    calls, _, _ = drive([WorkerReply(text="Biscuit.")])
    contents = " ".join(doc(calls[0]).xpath("//Content/text()"))
    assert "greyhound named Biscuit" in contents


def test_consult_changes_the_view_and_is_traced():
    def consult_first_summary(call):
        return WorkerReply(text=f'Let me look. Consult("need it", "{summary_node_ids(call)[0]}")')

    calls, outcome, _ = drive([consult_first_summary, WorkerReply(text="Biscuit.")])
    target = summary_node_ids(calls[0])[0]
    assert len(calls) == 2 and outcome.rounds == 2
    node = doc(calls[1]).xpath(f"//Node[@id='{target}']")[-1]  # shown again after what the frame showed of it
    assert node_view(node) == "Detail"
    step = doc(calls[1]).find("Reasoning_Trace/Step")
    assert (step.get("action"), step.get("target"), step.get("reason")) == ("Consult", target, "need it")
    assert outcome.text == "Biscuit."


def test_shelve_folds_a_page_back():
    def shelve_injected(call):
        detail = [n.get("id") for n in doc(call).iter("Node") if node_view(n) == "Detail"][0]
        return WorkerReply(text=f"Shelve(not needed, {detail})")

    calls, _, _ = drive([shelve_injected, WorkerReply(text="ok")])
    shelved = doc(calls[1]).find("Reasoning_Trace/Step").get("target")
    assert not [n for n in doc(calls[1]).xpath(f"//Node[@id='{shelved}']") if node_view(n) == "Detail"]


def test_explore_injects_matching_pages():
    messages = history()
    messages[100]["content"] = "The boiler code is E-117, reset it with the red button."
    ctx = context(query="what should I do about the heating system?")
    calls, _, _ = drive(
        [WorkerReply(text='Explore("find the fault code", "history", "boiler, code")'), WorkerReply(text="Press the red button.")], ctx, messages
    )
    assert "E-117" not in " ".join(doc(calls[0]).xpath("//Content/text()"))
    assert "E-117" in " ".join(doc(calls[1]).xpath("//Content/text()"))


def test_explore_finds_pages_by_the_time_its_keywords_name():
    messages = []
    for month in range(1, 13):
        messages.append({"role": "user", "content": f"[2023-{month:02}-05 10:00]\nSession {month}: we planted beans and talked of rain."})
        messages += [{"role": "assistant" if i % 2 == 0 else "user", "content": f"Month {month}, remark {i} about the garden."} for i in range(7)]
    ctx = context(query="what did we plant?", budget=700)
    calls, _, _ = drive([WorkerReply(text='Explore("that month", "history", "June 2023")'), WorkerReply(text="Beans.")], ctx, messages)
    step = doc(calls[1]).find("Reasoning_Trace/Step")
    assert step.get("action") == "Explore" and step.get("result") != "found nothing"
    # ISO headers hold no word "June": only the pages' timestamps lead there.
    assert "Session 6:" not in " ".join(doc(calls[0]).xpath("//Content/text()"))
    assert "Session 6:" in " ".join(doc(calls[1]).xpath("//Content/text()"))


def test_the_last_round_forbids_directives_and_answers():
    looping = WorkerReply(text='Consult("more", "nope-not-an-id-0")')
    calls, outcome, _ = drive([WorkerReply(text="Consult(a, b)"), looping, looping, looping], context(max_rounds=3))
    assert len(calls) <= 3
    assert doc(calls[-1]).find("ST-Node[@id='FINAL_ROUND']") is not None
    assert outcome.text == NO_ANSWER  # the final reply had nothing but a directive


def test_a_bus_fault_is_explained_once_then_the_worker_must_answer():
    calls, outcome, _ = drive([WorkerReply(text='Consult("unclosed'), WorkerReply(text="Biscuit, I think.")])
    assert len(calls) == 2
    step = doc(calls[1]).find("Reasoning_Trace/Step")
    assert step.get("action") == "BusFault" and step.get("reason")
    assert doc(calls[1]).find("ST-Node[@id='FINAL_ROUND']") is not None
    assert outcome.text == "Biscuit, I think."


def test_unknown_ids_are_bus_faults():
    calls, _, _ = drive([WorkerReply(text='Consult("x", "deadbeef99")'), WorkerReply(text="fine")])
    step = doc(calls[1]).find("Reasoning_Trace/Step")
    assert step.get("action") == "BusFault" and "deadbeef99" in step.get("reason")


def test_every_worker_prompt_holds_the_budget():
    def consult_everything(call):
        return WorkerReply(text="\n".join(f'Consult("x", "{i}")' for i in summary_node_ids(call)[:6]))

    calls, _, _ = drive([consult_everything] * 3 + [WorkerReply(text="done")], context(budget=1024))
    assert all(prompt_tokens(c.messages, COUNT) <= 1024 for c in calls)


def test_tools_channel_offers_directive_tools_and_reads_calls():
    def tool_consult(call):
        target = summary_node_ids(call)[0]
        return WorkerReply(
            text="", tool_calls=[{"id": "c1", "type": "function", "function": {"name": "pcp_consult", "arguments": json.dumps({"reason": "r", "id": target})}}]
        )

    calls, outcome, _ = drive([tool_consult, WorkerReply(text="Biscuit.")], context(channel="tools"))
    assert calls[0].tools == DIRECTIVE_TOOLS
    assert doc(calls[1]).find("Reasoning_Trace/Step").get("action") == "Consult"
    assert outcome.text == "Biscuit."


def test_a_client_tool_call_ends_the_loop():
    client_tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    call = {"id": "c9", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    calls, outcome, _ = drive([WorkerReply(text="", tool_calls=[call])], context(client_tools=[client_tool]))
    assert calls[0].tools == [client_tool]
    assert outcome.kind == "client_tool_calls" and outcome.rounds == 1


def test_low_entropy_query_borrows_the_previous_summary():
    _, outcome, index = drive([WorkerReply(text="ok")], context(query="continue"))
    last = list(index.leaves())[-1]
    assert outcome.intent.borrowed
    assert set(outcome.intent.weights) & set(w.lower() for w in last.keywords)


def test_dense_recall_is_fused_with_bm25():
    import numpy as np

    from pcp_core.effects import Similarity

    messages = history()
    messages[120]["content"] = "Our puppy finally learned to sit, what a good boy."
    index = retroactive_paging(turns_from_messages(messages, "2026-11-22T09:00:00"), COUNT)
    loop = run_rounds(context(query="How is the dog's training going?", dense=True), index, COUNT)
    effect = next(loop)
    assert isinstance(effect, Similarity) and effect.query == "How is the dog's training going?"
    # A stand-in embedder that knows puppies are dogs: only that page points where the query does.
    call = loop.send(np.array([1.0 if "puppy" in text else 0.0 for text in effect.texts]))
    assert "puppy finally learned" in " ".join(doc(call).xpath("//Content/text()"))


def test_without_embeddings_bm25_alone_decides():
    messages = history()
    messages[120]["content"] = "Our puppy finally learned to sit, what a good boy."
    index = retroactive_paging(turns_from_messages(messages, "2026-11-22T09:00:00"), COUNT)
    loop = run_rounds(context(query="How is the dog's training going?", dense=True), index, COUNT)
    next(loop)
    call = loop.send(None)  # the host has no embedder
    assert "puppy finally learned" not in " ".join(doc(call).xpath("//Content/text()"))


def test_a_call_of_a_tool_nobody_offered_is_a_bus_fault():
    call = {"id": "c1", "type": "function", "function": {"name": "launch_rockets", "arguments": "{}"}}
    calls, outcome, _ = drive([WorkerReply(text="", tool_calls=[call]), WorkerReply(text="Biscuit.")])
    step = doc(calls[1]).find("Reasoning_Trace/Step")
    assert step.get("action") == "BusFault" and "launch_rockets" in step.get("reason")
    assert outcome.kind == "answer" and outcome.text == "Biscuit."


@pytest.mark.parametrize(
    ("name", "arguments", "reason"),
    [
        ("pcp_consult", "[1, 2]", "expected an object"),
        ("pcp_consult", {"reason": "r", "id": "x"}, "arguments are not valid"),
        ("pcp_explore", '{"reason": "r", "handle": "history", "keywords": ["garden", 7]}', "keywords"),
    ],
)
def test_a_directive_tool_call_with_arguments_of_the_wrong_shape_is_a_bus_fault(name, arguments, reason):
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    calls, outcome, _ = drive([WorkerReply(text="", tool_calls=[call]), WorkerReply(text="Biscuit.")], context(channel="tools"))
    step = doc(calls[1]).find("Reasoning_Trace/Step")
    assert step.get("action") == "BusFault" and reason in step.get("reason")
    assert outcome.text == "Biscuit."


def test_explore_keywords_come_as_a_list_or_as_one_string():
    for keywords in (["greyhound", " Biscuit "], "greyhound, Biscuit"):
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "pcp_explore", "arguments": json.dumps({"reason": "r", "handle": "history", "keywords": keywords})},
        }
        calls, _, index = drive([WorkerReply(text="", tool_calls=[call]), WorkerReply(text="ok")], context(channel="tools", query="And then?"))
        step = doc(calls[1]).find("Reasoning_Trace/Step")
        (biscuit,) = [p.id for p in index.leaves() if "Biscuit" in p.content]
        assert step.get("action") == "Explore" and step.get("result").startswith(f"found {biscuit}")


def test_a_consult_on_a_container_brings_in_its_best_pages():
    messages = history()
    for i in range(60, 100, 4):  # ten mentions, in ten pages under one container
        messages[i] = {"role": "user", "content": f"Biscuit the greyhound learned trick number {i}."}
    index = retroactive_paging(turns_from_messages(messages, "2026-11-22T09:00:00"), COUNT)
    evidence = {p.id for p in index.leaves() if "trick" in p.content}
    root = next(r for r in index.roots if evidence <= {p.id for p in index.leaves([r])})
    loop = run_rounds(context(budget=1100, query="What tricks did Biscuit the greyhound learn?"), index, COUNT)

    def details(call):
        return {n.get("id") for n in etree.fromstring(paged(call.messages)).iter("Node") if node_view(n) == "Detail"}

    first = next(loop)
    second = loop.send(WorkerReply(f'Consult("more", "{root}")'))
    assert len((details(second) - details(first)) & evidence) >= 2


def test_diffusion_brings_in_pages_the_worker_has_not_read_in_any_round():
    index, ids = two_level_tree()
    ranked = [ids["a1"], ids["b1"], ids["a2"], ids["b2"]]
    consult_a = Consult(reason="more", id=ids["A"])
    assert _diffuse(consult_a, ranked, index, ViewState(index), 1, read=set()) == [ids["a1"], ids["a2"]]
    # a1 was read in round 0, though not in the last prompt: only a2 is new.
    assert _diffuse(consult_a, ranked, index, ViewState(index), 2, read={ids["a1"], ids["b1"]}) == [ids["a2"]]


def test_after_a_consult_what_it_found_then_the_focus_and_the_unread_come_before_what_was_read():
    hot = ["h1", "h2", "h3", "h4", "h5", "h6", "h7"]
    first = _priorities([], [], hot, set(), ["root"], [], [])
    assert first == ["h1", "h2", "h3", "h4", "root", "h5", "h6", "h7"]
    # Round 2: the worker asked for "c"; diffusion brought d1 (read in round 1) and d2 (new).
    read = {"h1", "h2", "h3", "h4", "h5", "d1", "c"}
    later = _priorities(["c"], ["d2", "d1"], hot, read, ["root"], [], [])
    assert later == ["c", "d2", "h1", "h2", "h3", "h4", "h6", "h7", "root", "d1", "h5"]
    # The final round cannot ask for more: the Router's best pages follow in its order, read or not.
    final = _priorities(["c"], ["d2", "d1"], hot, read, ["root"], [], [], final=True)
    assert final == ["c", "d2", "h1", "h2", "h3", "h4", "h5", "h6", "h7", "root", "d1"]


def test_a_worker_that_asks_for_more_is_shown_pages_it_has_not_read():
    index = retroactive_paging(turns_from_messages(history(), "2026-11-22T09:00:00"), COUNT)
    loop = run_rounds(context(budget=2048, query="What did we say about the garden and the weather?"), index, COUNT)

    def nodes(call, view, kind=("Original", "Consolidated")):
        return {n.get("id") for n in etree.fromstring(paged(call.messages)).iter("Node") if node_view(n) == view and node_type(n) in kind}

    first = next(loop)
    target = sorted(nodes(first, "Summary"))[0]
    second = loop.send(WorkerReply(f'Consult("more", "{target}")'))
    unread = nodes(second, "Detail", kind=("Original",)) - nodes(first, "Detail")
    assert len(unread) > DIFFUSION_PAGES  # more than the Consult itself brought in


def test_a_router_model_picks_among_the_best_ranked_pages():
    from pcp_core.effects import CallRouter
    from pcp_core.ranking.router import ROUTER_CANDIDATES

    index = retroactive_paging(turns_from_messages(history(), "2026-11-22T09:00:00"), COUNT)
    routed = context(query="Small talk about the garden and the weather", budget=900, router=True)

    def detail_ids(call):
        return {n.get("id") for n in doc(call).iter("Node") if node_view(n) == "Detail"}

    loop = run_rounds(routed, index, COUNT)
    effect = next(loop)
    assert isinstance(effect, CallRouter)
    candidates = re.findall(r"^\[(\w+)\] ", effect.messages[1]["content"], re.MULTILINE)
    assert len(candidates) == ROUTER_CANDIDATES
    pick = candidates[-1]  # the broad match's twelfth choice
    assert pick in detail_ids(loop.send(f"{pick}"))

    unrouted = run_rounds(routed, index, COUNT)
    next(unrouted)
    assert pick not in detail_ids(unrouted.send(None))  # the router model failed: the ranking stands


def test_the_outcome_tells_how_warm_and_how_stale_each_touched_page_is():
    def consult_first_summary(call):
        return WorkerReply(text=f'Consult("need it", "{summary_node_ids(call)[0]}")')

    calls, outcome, _ = drive([consult_first_summary, WorkerReply(text="Biscuit.")])
    consulted = summary_node_ids(calls[0])[0]
    hot = [p for p, state in outcome.pages.items() if state.activation == "Hot"]
    assert hot and consulted not in hot
    # Touched in round 0 only: one round's decay, one round stale. The consulted page, in round 1: neither.
    assert any((outcome.pages[p].heat, outcome.pages[p].staleness) == (0.5, 1) for p in hot)
    assert all(state.staleness in (0, 1) for state in outcome.pages.values())
    assert (outcome.pages[consulted].heat, outcome.pages[consulted].staleness) == (1.0, 0)


def test_explore_under_a_handle_searches_that_subtree_only():
    messages = history()
    messages[20]["content"] = "The boiler code is E-117, reset it with the red button."
    messages[200]["content"] = "The boiler code at the cabin is C-404, reset it by the fuse box."
    index = retroactive_paging(turns_from_messages(messages, "2026-11-22T09:00:00"), COUNT)
    leaf = next(p for p in index.leaves() if p.first_turn <= 200 <= p.last_turn)
    late = index.parent(leaf.id)  # the topic group around turn 200
    assert not index.get(late).first_turn <= 20 <= index.get(late).last_turn
    explore = f'Explore("the cabin", "{late}", "boiler, code, reset")'
    calls, outcome, _ = drive([WorkerReply(text=explore), WorkerReply(text="The fuse box.")], context(query="what now?"), messages)
    shown = " ".join(doc(calls[1]).xpath("//Content/text()"))
    assert "C-404" in shown and "E-117" not in shown  # the better-worded match outside the handle stays out
    (step,) = outcome.trace
    found = step.result.removeprefix("found ").split(", ")
    assert found and all(index.get(p).first_turn >= index.get(late).first_turn for p in found)
