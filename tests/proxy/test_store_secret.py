"""The install secret, which names the callers' namespaces, is durable wherever the store is: a store that empties gets it back.

Real redis-servers and real ``pcp-proxy serve`` processes: the store is
emptied (FLUSHALL) while a proxy runs; a session saved since is listed under
the same key after the proxy restarts, and by a replica that starts with no
copy of the secret of its own. A store that holds another secret than the
one a running proxy names namespaces by is said loudly, and the proxy goes
on with the namespaces it had.
"""

from __future__ import annotations

import logging

import pytest

from pcp_core import Session
from proxy.storage import Stores
from proxy.storage.datadir import STORE_SECRET_FILE, install_secret
from proxy.storage.redis_store import SharedSecret
from proxy.storage.sessions import SessionStore
from tests.proxy.helpers import ask, conversation, eventually
from tests.proxy.test_scaling import Served, served  # noqa: F401 (a fixture)

KEY = SharedSecret.KEY


def listed(proxy: Served, key: str = "sk-a") -> set[str]:
    return {s["id"] for s in proxy.http.get("/v1/pcp/sessions", headers={"authorization": f"Bearer {key}"}).json()["data"]}


def chat(n: int) -> list[dict]:
    return [*conversation(160, start=1000 * n), {"role": "user", "content": f"Question {n}?"}]


def test_a_store_emptied_while_the_proxy_runs_keeps_naming_the_sessions_saved_since(served, redis_server, tmp_path):
    data = tmp_path / "data-a"
    first = served(redis_server.url, data_dir=data)
    secret = redis_server.client().get(KEY)
    assert secret is not None and (data / STORE_SECRET_FILE).read_bytes() == secret  # the data dir keeps a copy

    redis_server.client().flushall()  # the store comes back empty
    saved = ask(first, chat(1)).headers["x-pcp-session"]  # a session saved since
    assert listed(first) == {saved}
    first.stop()

    again = served(redis_server.url, data_dir=data)  # a restart: the same secret, written back, not a new one
    assert redis_server.client().get(KEY) == secret
    assert listed(again) == {saved}
    follow_up = ask(again, [*chat(1), {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And then?"}])
    assert follow_up.headers["x-pcp-session"] == saved


def test_a_running_proxy_writes_the_secret_back_for_a_replica_that_starts_without_a_copy(served, redis_server, tmp_path):
    first = served(redis_server.url, data_dir=tmp_path / "data-a")
    secret = redis_server.client().get(KEY)
    redis_server.client().flushall()
    saved = ask(first, chat(2)).headers["x-pcp-session"]
    eventually(lambda: redis_server.client().get(KEY) == secret, timeout=SharedSecret.CHECK_SECONDS * 3, awaiting="the running proxy to write the secret back")
    replica = served(redis_server.url, data_dir=tmp_path / "data-b")  # a data dir of its own, with no copy
    assert listed(replica) == {saved}


def test_a_store_that_holds_another_secret_is_said_loudly_and_the_namespaces_stay(redis_server, tmp_path, caplog):
    caplog.set_level(logging.WARNING, "pcp.store")
    client = redis_server.client()
    kept = SharedSecret(client, tmp_path / "a")
    secret = kept.open()
    client.set(KEY, b"x" * 32)  # emptied, and another process made a new one
    kept.check()
    kept.check()
    assert kept.secret == secret and client.get(KEY) == b"x" * 32  # neither is overwritten
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "another install secret" in errors[0].getMessage()  # said once, not every few seconds

    client.delete(KEY)
    kept.check()  # lost: written back
    assert client.get(KEY) == secret


def test_a_new_secret_over_sessions_it_cannot_name_is_said_loudly(redis_server, tmp_path, caplog):
    caplog.set_level(logging.WARNING, "pcp.store")
    client = redis_server.client()
    client.set("pcp:s:session:0123:s-1", b"a session")  # sessions, but no secret, and no copy in the data dir
    SharedSecret(client, tmp_path / "fresh").open()
    assert any(r.levelno == logging.ERROR and "found by no key" in r.getMessage() for r in caplog.records)

    caplog.clear()
    client.delete(KEY)
    copy = (tmp_path / "fresh" / STORE_SECRET_FILE).read_bytes()
    assert SharedSecret(client, tmp_path / "fresh").open() == copy == client.get(KEY)  # with a copy: written back, no new one
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]


def test_the_data_dir_that_lost_its_secret_says_so_when_it_holds_sessions(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "pcp.store")
    data = tmp_path / "data"
    first = install_secret(data)
    sessions = SessionStore(data / "sessions")
    sessions.save("ns", Session(id="s-1", chain=["a"], seen_at=["t"]), new_links=1)
    sessions.close()
    assert Stores("", data).secret() == first and not caplog.records
    (data / "install-secret").unlink()
    assert Stores("", data).secret() != first
    assert any(r.levelno == logging.ERROR and "found by no key" in r.getMessage() for r in caplog.records)


def test_the_secret_file_is_made_whole_by_one_of_many(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        made = set(pool.map(lambda _: install_secret(tmp_path / "data"), range(32)))
    assert len(made) == 1 and [p.name for p in (tmp_path / "data").iterdir()] == ["install-secret"]  # no file of its making left


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.WARNING, "pcp.store")
