"""Several proxy processes on one store: a real redis-server, and real `pcp-proxy serve` processes.

Follow-ups move between processes, run at the same time, outlive a Redis
restart and a worker killed mid-write; callers stay apart in Redis as on disk.
The embedded store shared by workers (one data dir) is checked the same way,
in process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.memory.store import scope_key
from proxy.testing.upstream import completion, metric_value
from tests.proxy.helpers import ask, conversation, eventually, free_port
from tests.proxy.serving import wait_healthy

SETTINGS = {"sentry_threshold": 500, "context_budget": 1024, "router_embeddings": False, "log_level": "warning"}


class Served:
    """``pcp-proxy serve`` in a process of its own, on ``store``."""

    def __init__(self, upstream: str, data_dir: Path, store: str = "", **settings: object):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PCP_")}
        env.update(
            {
                f"PCP_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in {**SETTINGS, "data_dir": data_dir, "store": store, **settings}.items()
            }
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_healthy(self.process, self.port)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def metric(self, name: str, **labels: str) -> int:
        return metric_value(self.http.get("/metrics").text, name, **labels)

    def counted(self, name: str) -> int:
        """A counter summed over its labels."""
        return sum(int(row.rsplit(" ", 1)[1]) for row in self.http.get("/metrics").text.splitlines() if row.startswith(name + "{"))

    def stop(self, kill: bool = False) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.process.wait(timeout=30)
        self.http.close()  # after the process: a request under way fails on its connection, not on a closed client


@pytest.fixture
def served(served_upstream, tmp_path):
    served_upstream.default = lambda recorded: completion("Noted.")
    running: list[Served] = []

    def start(store: str = "", data_dir: Path | None = None, **settings: object) -> Served:
        proxy = Served(served_upstream.url, data_dir or tmp_path / f"data-{len(running)}", store, **settings)
        running.append(proxy)
        return proxy

    yield start
    for proxy in running:
        proxy.stop()


def said(i: int) -> list[dict]:
    """An answer and the next question: the messages a follow-up adds (each its own, so two are two branches)."""
    return [{"role": "assistant", "content": f"Noted, house {i - 1}."}, {"role": "user", "content": f"Question {i}: what about the roof of house {i}?"}]


def test_follow_ups_alternating_between_two_processes_keep_one_session_and_page_only_what_is_new(served, redis_server):
    a, b = served(redis_server.url), served(redis_server.url)
    messages = [*conversation(160), {"role": "user", "content": "Question 0?"}]
    first = ask(a, messages)
    assert first.status_code == 200 and first.headers["x-pcp-mode"] == "protocol"
    session = first.headers["x-pcp-session"]
    for i in range(1, 7):
        proxy = (a, b)[i % 2]
        before = proxy.metric("pcp_turns_paged_total")
        messages = [*messages, *said(i)]
        answer = ask(proxy, messages)
        assert answer.status_code == 200 and answer.headers["x-pcp-session"] == session
        assert proxy.metric("pcp_turns_paged_total") - before <= 2 + 4  # its new messages and the reopened last page
    assert a.metric("pcp_sessions_total", how="new") + b.metric("pcp_sessions_total", how="new") == 1
    assert a.metric("pcp_sessions_total", how="resumed") + b.metric("pcp_sessions_total", how="resumed") == 6


def test_ten_concurrent_follow_ups_over_two_processes_page_every_message_once(served, redis_server):
    a, b = served(redis_server.url), served(redis_server.url)
    history = [*conversation(160), {"role": "user", "content": "Question 0?"}]
    session = ask(a, history).headers["x-pcp-session"]
    paged = lambda: a.metric("pcp_turns_paged_total") + b.metric("pcp_turns_paged_total")  # noqa: E731
    before = paged()
    branches = [[*history, *said(i)] for i in range(1, 11)]  # ten follow-ups of one session, each its own
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda i: ask((a, b)[i % 2], branches[i], status=None), range(10)))
    assert all(r.status_code == 200 for r in answers)
    burst = paged() - before
    ids = [r.headers["x-pcp-session"] for r in answers]
    # One branch keeps the session's id; each other one is a fork of its own: no branch lost its pages.
    assert ids.count(session) == 1 and len(set(ids)) == 10
    assert burst <= 10 * (2 + 4)  # each request paged its own new messages once: none was paged again on a lost race
    for i, branch in enumerate(branches):  # every branch goes on, on the other process, paging only what is new
        proxy = (b, a)[i % 2]
        before = proxy.metric("pcp_turns_paged_total")
        answer = ask(proxy, [*branch, *said(100 + i)])
        assert answer.headers["x-pcp-session"] == ids[i]
        assert proxy.metric("pcp_turns_paged_total") - before <= 2 + 4


def test_a_redis_restart_loses_nothing_acknowledged_and_the_proxy_recovers_by_itself(served, redis_server):
    a, b = served(redis_server.url), served(redis_server.url)
    messages = [*conversation(160), {"role": "user", "content": "Question 0?"}]
    session = ask(a, messages, headers={"x-pcp-memory": "notes"}).headers["x-pcp-session"]
    for i in range(1, 4):
        messages = [*messages, *said(i)]
        ask((a, b)[i % 2], messages, headers={"x-pcp-memory": "notes"})
    _memory_written(a), _memory_written(b)
    counts = _memory_written(a)
    assert _memory_written(b)["pages"] == counts["pages"] > 0  # one memory, whichever process wrote it

    redis_server.stop()
    lost = ask(b, [*messages, *said(50)], status=None)
    assert lost.status_code == 503 and lost.json()["error"]["code"] == "store_unavailable"
    small = ask(b, [{"role": "user", "content": "Hi?"}])  # passthrough does not need the store
    assert small.status_code == 200 and small.headers["x-pcp-mode"] == "passthrough"

    redis_server.start()  # its append-only file read back

    def answered() -> httpx.Response | None:
        answer = ask(b, [*messages, *said(4)], status=None)
        return answer if answer.status_code != 503 else None

    answer = eventually(answered, timeout=20, interval=0.2, awaiting="the proxy to reach the restarted store")
    assert answer.status_code == 200 and answer.headers["x-pcp-session"] == session
    assert b.metric("pcp_sessions_total", how="resumed") >= 2
    after = a.http.get("/v1/pcp/memory/notes", headers={"authorization": "Bearer sk-a"}).json()
    assert after["pages"] >= counts["pages"] and after["conversations"] == counts["conversations"]


def _memory_written(proxy: Served, scope: str = "notes", key: str = "sk-a") -> dict:
    """The scope's counts once the process has no write-back pending."""

    def written() -> dict | None:
        counts = proxy.http.get(f"/v1/pcp/memory/{scope}", headers={"authorization": f"Bearer {key}"}).json()
        return None if counts["pending"] else counts

    return eventually(written, timeout=20, interval=0.1, awaiting=f"memory {scope!r} to have no write-back pending")


def _sessions_in_redis(client) -> list[tuple[str, str]]:
    return [tuple(k.decode().split(":", 4)[3:5]) for k in client.scan_iter(match="pcp:s:session:*")]


def test_a_worker_killed_mid_write_leaves_no_half_written_session(served, redis_server, tmp_path):
    from proxy.storage import RedisStore
    from proxy.storage.sessions import SessionStore

    client = redis_server.client()
    rounds = 0
    for attempt in range(4):
        proxy = served(redis_server.url)
        stop = threading.Event()
        answers: list[float] = []  # when each answer came: the store holds its session then (``Rounds._stored``)

        def talk(n: int = attempt, stop: threading.Event = stop, proxy: Any = proxy, answers: list[float] = answers) -> None:
            for i in range(100):  # long histories: each write is some hundreds of kB
                if stop.is_set():
                    return
                try:
                    ask(proxy, [*conversation(1500 + 40 * i, start=n * 5000), {"role": "user", "content": f"Q{i}?"}], status=None)
                except httpx.HTTPError:
                    return
                answers.append(time.monotonic())

        talker = threading.Thread(target=talk)
        talker.start()
        eventually(lambda: len(answers) >= 2, timeout=60, awaiting="two answers, their session in the store")  # noqa: B023
        # The third request's cycle (paging, then the write while the worker is asked) takes about as long as
        # the second's: each attempt kills at another point of it, from its start to three quarters through.
        kill_at = answers[1] + (answers[1] - answers[0]) * attempt / 4
        eventually(lambda: time.monotonic() >= kill_at, awaiting=f"{attempt}/4 of a request's cycle")  # noqa: B023
        stop.set()  # the request under way is the talker's last
        proxy.stop(kill=True)  # kill -9, mid-request or mid-write
        talker.join(timeout=30)
        rounds += 1
    store = SessionStore(RedisStore(client, "s"))
    found = _sessions_in_redis(client)
    assert found, "no session reached the store before the kills"
    for namespace, session_id in found:
        assert store.read(namespace, session_id) is not None, f"session {session_id} is not whole"
    assert rounds == 4


def test_callers_stay_apart_in_redis_and_no_key_is_stored(served, redis_server, served_upstream):
    a = served(redis_server.url)
    alpha, beta = "sk-alpha-0d7e51c8", "sk-beta-93ab2f44"
    secret = [*conversation(160), {"role": "user", "content": "The vault code is zanzibar-4471. Noted?"}]
    ask(a, secret, key=alpha, headers={"x-pcp-session": "trip", "x-pcp-memory": "shared"})
    theirs = ask(
        a,
        [*conversation(160, start=500), {"role": "user", "content": "Anything about a vault?"}],
        key=beta,
        headers={"x-pcp-session": "trip", "x-pcp-memory": "shared"},
    )
    assert theirs.headers["x-pcp-session"] == "trip"
    assert not any("zanzibar" in r.body.decode() for r in served_upstream.requests[-2:] if r.headers.get("authorization", "").endswith(beta))
    assert _memory_written(a, "shared", beta)["pages"] >= 1
    listed = a.http.get("/v1/pcp/memory/shared/pages", params={"query": "zanzibar"}, headers={"authorization": f"Bearer {beta}"}).json()["data"]
    assert not any("zanzibar" in (p.get("content") or "") for p in listed)

    client = redis_server.client()
    names = [k for k in client.scan_iter(match="*")]
    values = b"".join(_value(client, k) for k in names)
    for key in (alpha, beta):
        assert key.encode() not in values and key.encode() not in b"".join(names)
    namespaces = {m.group(1) for k in names if (m := re.match(rb"pcp:s:session:([0-9a-f]{32}):trip$", k))}
    assert len(namespaces) == 2  # one "trip" per caller, each under its namespace's hash
    assert any(scope_key(ns.decode(), "shared").encode() in k for ns in namespaces for k in names)


def _value(client, name: bytes) -> bytes:
    kind = client.type(name)
    if kind == b"string":
        return client.get(name) or b""
    if kind == b"hash":
        return b"".join(b"".join(pair) for pair in client.hgetall(name).items())
    if kind in (b"set",):
        return b"".join(client.smembers(name))
    if kind == b"zset":
        return b"".join(client.zrange(name, 0, -1))
    if kind == b"stream":
        return b"".join(v for _, fields in client.xrange(name) for v in fields.values())
    return b""


def test_a_store_that_cannot_be_reached_stops_the_start_naming_the_setting(tmp_path):
    from proxy.cli.main import main

    port = free_port()
    env = {"PCP_STORE": f"redis://127.0.0.1:{port}/0", "PCP_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--upstream", "http://127.0.0.1:9/v1"],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PCP_")}, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "setting store (env PCP_STORE)" in done.stderr and "cannot be reached" in done.stderr
    os.environ.pop("PCP_STORE", None)
    assert main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--config", _toml(tmp_path, 'store = "http://example"')]) == 2


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "settings.toml"
    path.write_text(text)
    return str(path)


# -- the embedded store shared by workers ----------------------------------------------------
def test_workers_sharing_the_data_dir_never_serve_a_session_another_has_changed(start_proxy, upstream, tmp_path):
    upstream.default = lambda recorded: completion("Noted.")
    one, two = (start_proxy(workers=2, **{k: v for k, v in SETTINGS.items() if k != "log_level"}) for _ in range(2))
    assert one.services.sessions.shared and two.services.sessions.shared
    history = [*conversation(160), {"role": "user", "content": "Question 0?"}]
    session = ask(one, history, key=None).headers["x-pcp-session"]
    grown = [*history, *said(1)]
    assert ask(two, grown, key=None).headers["x-pcp-session"] == session  # found on the shared disk
    # ``one`` holds the session as it was in memory; ``two`` has moved it on: ``one`` must read it again.
    branch = [*history, *said(2)]
    forked = ask(one, branch, key=None)
    assert forked.headers["x-pcp-session"] != session  # two branches: the one kept second forks, neither is lost
    assert ask(one, [*grown, *said(3)], key=None).headers["x-pcp-session"] == session
    assert ask(two, [*branch, *said(4)], key=None).headers["x-pcp-session"] == forked.headers["x-pcp-session"]


# -- the rule, store by store: two processes' stores, one session --------------------------------
@pytest.fixture(params=["embedded", "redis"])
def two_stores(request, tmp_path):
    """Two session stores on one shared store, as two processes have them."""
    from proxy.storage import EmbeddedStore, RedisStore
    from proxy.storage.sessions import SessionStore

    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        made = [SessionStore(RedisStore(server.client(), "s")) for _ in range(2)]
    else:
        made = [SessionStore(EmbeddedStore(tmp_path / "sessions", shared=True)) for _ in range(2)]
    yield made
    for store in made:
        store.close()


@pytest.fixture(params=["embedded", "redis"])
def two_shared(request, tmp_path):
    """Two stores of a kind kept beside sessions (components, Hybrid state, a scope's core) on one shared store, as two processes have them."""
    import msgspec

    from proxy.storage import EmbeddedStore, RedisStore
    from proxy.storage.keyed_store import KeyedStore

    class Count(msgspec.Struct, frozen=True):
        n: int

    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        made = [KeyedStore(RedisStore(server.client(), "c"), Count, "a count") for _ in range(2)]
    else:
        made = [KeyedStore(EmbeddedStore(tmp_path / "components", shared=True), Count, "a count") for _ in range(2)]
    yield made, Count
    for store in made:
        store.close()


def test_changes_of_one_value_from_two_processes_at_once_are_all_kept(two_shared):
    (one, two), Count = two_shared

    def add_one(_: int) -> None:
        for store in (one, two):
            store._change("ns\x1fs-1", lambda held: Count(held.n + 1 if held is not None else 1))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(add_one, range(40)))  # 80 changes, from two stores and eight threads at once
    assert one.get("ns", "s-1") == two.get("ns", "s-1") == Count(80)


def _page(messages: list[dict], known=None):
    from proxy.testing.upstream import paged_session
    from tests.proxy.test_sessions import COUNT

    return paged_session(messages, COUNT, known)


def _resolved(store, messages: list[dict]):
    from pcp_core import Conversation

    return store.resolve("ns", Conversation(head=[], history=list(messages), query=None))


@pytest.mark.parametrize("case", ["branches", "extends", "holds", "pinned"])
def test_of_two_saves_on_one_version_the_second_is_reconciled_and_nothing_is_lost(two_stores, case):
    import msgspec

    one, two = two_stores
    base = conversation(40)
    start = _page(base)
    one.save("ns", start, len(start.chain), base, base="").kept.result()
    found_one, found_two = _resolved(one, [*base, *said(1)]), _resolved(two, [*base, *said(2)])
    assert found_one.found.id == found_two.found.id == start.id and found_one.version == found_two.version
    winner_said = [*base, *said(1)]
    mine_said = {"branches": [*base, *said(2)], "extends": [*base, *said(1), *said(3)], "holds": base, "pinned": [*base, *said(2)]}[case]
    winner = _page(winner_said, start)
    mine = _page(mine_said, start)
    mine = msgspec.structs.replace(
        mine, pages=msgspec.structs.replace(mine.pages, storage=[*mine.pages.storage, *winner.pages.leaves[-1:]])
    )  # a page it solidified
    assert one.save("ns", winner, 2, winner_said, base=found_one.version).kept.result().session == winner
    kept = two.save("ns", mine, len(mine.chain) - len(start.chain), mine_said, base=found_two.version, pinned=case == "pinned").kept.result()
    expected_id = {"branches": "new", "extends": start.id, "holds": start.id, "pinned": start.id}[case]
    assert (kept.session.id != start.id) if expected_id == "new" else kept.session.id == start.id
    if case in ("branches", "extends", "pinned"):
        assert kept.session.chain == mine.chain  # its messages, with the pages it paged: nothing paged again
    if case == "holds":
        assert kept.session.chain == winner.chain and kept.session.pages.storage[-1:] == winner.pages.leaves[-1:]
    reader = type(one)(one.store)  # a third process: what the store holds
    # (A pinned session follows its client: the branch saved last replaces the other, as an edit would.)
    checked = (
        [(mine_said, kept.session)]
        if case == "pinned"
        else [(winner_said, kept.session if case in ("extends", "holds") else winner), (mine_said, kept.session)]
    )
    for messages, session in checked:
        found = _resolved(reader, messages)
        assert found.found is not None and found.found.id == session.id and found.reused == len(messages)


# -- vectors on every replica ---------------------------------------------------------------------
def test_vectors_one_replica_encodes_reach_the_others_and_no_text_is_encoded_twice(redis_server):
    import numpy as np

    from proxy.recall.stored_vectors import StoredVectors
    from proxy.recall.vectors import VectorCache
    from proxy.storage import RedisStore

    def replica(variant: bytes = b"minilm") -> StoredVectors:
        stored = StoredVectors(RedisStore(redis_server.client(), "v"), VectorCache(1000, variant))
        stored.listen()
        return stored

    a, b = replica(), replica()
    texts = [f"page {i}: the lamp is in room {i}" for i in range(100)]
    assert a.claim(texts) == texts and b.claim(texts) == []  # the first to claim a text encodes it; the other waits
    vectors = np.random.default_rng(0).normal(size=(100, 8)).astype(np.float32)
    a.put(texts, vectors)
    eventually(lambda: len(b.cache.found(texts)) == 100, awaiting="b to take the vectors a announced into memory")
    held = vectors.astype(np.float16).astype(np.float32)  # memory holds rows in half precision
    assert np.array_equal(np.vstack([b.cache.found(texts)[t] for t in texts]), held)
    late = replica()  # a replica that starts takes the latest vectors from the store
    eventually(lambda: len(late.cache.found(texts)) == 100, awaiting="a replica that starts late to take the latest vectors from the store")
    # Another encoder's replica: its vectors are not these. It takes in what its own encoder's replicas
    # announce (one vector, here), and by then it would have taken these in, were they announced to it.
    mpnet = replica(b"mpnet")
    mpnet.put(["a page the other encoder encoded"], np.ones((1, 8), dtype=np.float32))
    other = replica(b"mpnet")
    eventually(lambda: other.cache.found(["a page the other encoder encoded"]), awaiting="the other encoder's replica to take in its own announcement")
    assert other.claim(texts) == texts and other.get(texts) == {} and len(other.cache) == 1
    for stored in (a, b, late, mpnet, other):
        stored.close()


def test_serve_with_two_workers_spreads_connections_keeps_one_session_and_replaces_a_worker_killed(served, redis_server):
    proxy = served(redis_server.url, workers=2)
    workers = _workers(proxy)
    assert len(workers) == 2
    messages = [*conversation(160), {"role": "user", "content": "Question 0?"}]
    session = None
    for i in range(1, 9):  # a new connection each time: the kernel spreads them over the workers
        with httpx.Client(base_url=f"http://127.0.0.1:{proxy.port}", timeout=30) as client:
            answer = client.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers={"authorization": "Bearer sk-a"})
        assert answer.status_code == 200
        session = session or answer.headers["x-pcp-session"]
        assert answer.headers["x-pcp-session"] == session
        messages = [*messages, *said(i)]
        if i == 4:
            os.kill(workers[0], signal.SIGKILL)  # a worker killed: the others serve, and it is replaced
            _gone(workers[0])  # (connections the kernel had queued for it die with it)
    eventually(lambda: len(set(_workers(proxy)) - {workers[0]}) == 2, timeout=30, interval=0.2, awaiting="the killed worker to be replaced")


def _gone(pid: int) -> None:
    eventually(lambda: _dead(pid), interval=0.02, awaiting=f"process {pid} to be gone")


def _dead(pid: int) -> bool:
    """Whether the process is gone, or a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _workers(proxy: Served) -> list[int]:
    """The worker processes of a ``--workers N`` proxy (not multiprocessing's resource tracker)."""
    children = subprocess.run(["pgrep", "-P", str(proxy.process.pid)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in children if _is_worker(pid)]


def _is_worker(pid: str) -> bool:
    try:
        return b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # gone since pgrep listed it
        return False
