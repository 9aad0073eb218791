"""Tenants and what is kept: namespaces as a keyed hash of the credential, a private data dir, text encrypted at rest, metrics behind a key."""

from __future__ import annotations

import base64
import os
import signal
import stat
import subprocess
import sys
import threading

import httpx
import pytest

from proxy.settings import SettingsError, load_settings
from proxy.storage.datadir import Namespaces, install_secret, normalised_credential, private_tree
from proxy.storage.sealing import MAGIC, Sealer, data_key
from proxy.testing.upstream import SUMMARY_DONE, completion, metric_value
from tests.proxy.helpers import ask, free_port, through
from tests.proxy.serving import wait_healthy

SECRET_WORD = "zanzibarquokka"
HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: the {SECRET_WORD} plan, step {i}, and the budget."} for i in range(80)]
KEY = base64.b64encode(bytes(range(32))).decode()


def asking(question: str = "What was step 7?") -> list[dict]:
    return [*HISTORY, {"role": "user", "content": question}]


def following(answered: httpx.Response) -> list[dict]:
    """The conversation of ``asking()`` going on past its answer (the same history with another question is a branch)."""
    return [*asking(), answered.json()["choices"][0]["message"], {"role": "user", "content": "And step 8?"}]


# -- namespaces -------------------------------------------------------------------------------


@pytest.mark.parametrize("written", ["bearer sk-a", "Bearer  sk-a", "BEARER sk-a ", "Bearer\tsk-a"])
def test_one_key_written_another_way_is_one_namespace(start_proxy, written):
    proxy = start_proxy(sentry_threshold=300)
    first = ask(proxy, asking())
    second = ask(proxy, following(first), key=None, headers={"authorization": written})
    assert second.headers["x-pcp-session"] == first.headers["x-pcp-session"]


def test_namespaces_are_128_bit_keyed_hashes_of_the_credential(tmp_path):
    one, other = Namespaces(install_secret(tmp_path / "a")), Namespaces(install_secret(tmp_path / "b"))
    headers = {"authorization": "Bearer sk-a"}
    assert len(one.of(headers)) == 32 and int(one.of(headers), 16) >= 0
    assert one.of(headers) != other.of(headers)  # another install's secret: another name
    assert one.of(headers) == Namespaces(install_secret(tmp_path / "a")).of(headers)  # the secret is kept
    assert one.of({"authorization": "Bearer sk-b"}) != one.of(headers)
    assert normalised_credential({"api-key": " az-1 "}) == "api-key az-1" and normalised_credential({}) == ""


def test_the_install_secret_is_private(tmp_path):
    install_secret(tmp_path / "data")
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "data" / "install-secret").stat().st_mode) == 0o600


# -- permissions ------------------------------------------------------------------------------


def test_a_data_dir_left_open_is_closed_at_start(tmp_path):
    data = tmp_path / "data"
    (data / "sessions").mkdir(parents=True, mode=0o755)
    (data / "sessions" / "cache.db").write_bytes(b"x")
    os.chmod(data, 0o755)
    os.chmod(data / "sessions" / "cache.db", 0o644)
    private_tree(data)
    assert [stat.S_IMODE(p.stat().st_mode) for p in (data, data / "sessions", data / "sessions" / "cache.db")] == [0o700, 0o700, 0o600]


def test_files_that_go_while_the_data_dir_is_closed_are_left_alone(tmp_path):
    # SQLite's journals come and go while another worker on the same data dir commits: a start must not fail on one.
    data = tmp_path / "data"
    data.mkdir()
    journals = [data / f"cache-{i}.db-journal" for i in range(3000)]
    for journal in journals:
        journal.write_bytes(b"")
        os.chmod(journal, 0o644)
    started = threading.Event()

    def commit() -> None:
        started.set()
        for journal in reversed(journals):
            journal.unlink()

    worker = threading.Thread(target=commit)
    worker.start()
    started.wait()
    private_tree(data)
    worker.join()
    assert not list(data.iterdir()) and stat.S_IMODE(data.stat().st_mode) == 0o700


def test_served_proxy_keeps_its_data_dir_0700_and_its_files_0600(served_upstream, tmp_path):
    served_upstream.default = lambda recorded: completion("Summary of the plan." if recorded.headers.get("x-pcp-role") == "consolidator" else "fine")
    data = tmp_path / "data"
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PCP_")},
        "PCP_DATA_DIR": str(data),
        "PCP_ROUTER_EMBEDDINGS": "false",
        "PCP_SENTRY_THRESHOLD": "300",
        "PCP_CONSOLIDATOR": "llm",
    }
    process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--upstream", served_upstream.url, "--port", str(port)], env=env)
    try:
        wait_healthy(process, port)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for question in ("What was step 7?", "And step 8?"):
                response = http.post("/v1/chat/completions", json={"model": "m", "messages": asking(question)}, headers={"authorization": "Bearer k"})
                assert response.status_code == 200
            # The summaries reach the disk in the background; the sessions, by the time the proxy has stopped.
            metrics = through(http, "pcp_summaries_total", SUMMARY_DONE)
        assert metric_value(metrics, "pcp_summaries_total", state="landed") > 0
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=15)
    entries = [data, *data.rglob("*")]
    assert len(entries) > 5
    for entry in entries:
        assert stat.S_IMODE(entry.stat().st_mode) == (0o700 if entry.is_dir() else 0o600), entry


# -- encryption at rest -----------------------------------------------------------------------


def _stored_bytes(tmp_path) -> bytes:
    return b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())


@pytest.mark.embedded_store
def test_with_a_data_key_no_stored_file_holds_the_conversations_text(start_proxy, upstream, tmp_path):
    upstream.default = lambda recorded: completion("Summary of the plan." if recorded.headers.get("x-pcp-role") == "consolidator" else "fine")
    proxy = start_proxy(sentry_threshold=300, data_key=KEY, summaries="llm")
    ask(proxy, asking())
    ask(proxy, asking("And step 8?"))
    proxy.stop()
    stored = _stored_bytes(tmp_path)
    assert MAGIC in stored
    assert SECRET_WORD.encode() not in stored and b"Summary of the plan" not in stored


@pytest.mark.embedded_store
def test_with_a_data_key_memory_pages_and_their_index_hold_no_text(start_proxy, tmp_path):
    proxy = start_proxy(sentry_threshold=300, data_key=KEY)
    remember(proxy)
    proxy.stop()
    memory = b"".join(p.read_bytes() for p in (tmp_path / "data" / "memory").rglob("*") if p.is_file())
    assert MAGIC in memory and SECRET_WORD.encode() not in memory


@pytest.mark.parametrize("later", [KEY, base64.b64encode(bytes(32)).decode(), None], ids=["same key", "another key", "no key"])
def test_the_keyword_index_keeps_its_words_sealed_and_opens_only_with_its_key(tmp_path, later):
    from proxy.memory.lexical import LexicalIndex

    index = LexicalIndex()
    index.add(1, {SECRET_WORD: 2, "plan": 1})
    index.save(tmp_path, row=1, seq=0, sealer=Sealer(data_key(KEY)))
    assert SECRET_WORD.encode() not in b"".join(p.read_bytes() for p in tmp_path.iterdir())
    loaded = LexicalIndex.load(tmp_path, Sealer(data_key(later)) if later else None)
    if later != KEY:
        assert loaded is None  # built again from the store's pages, which do not open either
    else:
        rows, _ = loaded.search({SECRET_WORD: 1.0}, 5)
        assert list(rows) == [1]


@pytest.mark.parametrize("later", [{"data_key": KEY}, {"data_key": base64.b64encode(bytes(32)).decode()}, {}], ids=["same key", "another key", "no key"])
def test_memory_sealed_under_a_key_opens_only_with_it(start_proxy, later):
    first = start_proxy(sentry_threshold=300, data_key=KEY)
    remember(first)
    first.stop()
    again = start_proxy(sentry_threshold=300, **later)
    again.services.memory.wait()
    listed = again.http.get("/v1/pcp/memory/plans/pages?limit=200", headers={"authorization": "Bearer sk-a"})
    found = again.http.get("/v1/pcp/memory/plans/pages", params={"query": f"{SECRET_WORD} step 7"}, headers={"authorization": "Bearer sk-a"})
    assert listed.status_code == found.status_code == 200
    opens = later.get("data_key") == KEY
    assert any(SECRET_WORD in page["content"] for page in listed.json()["data"]) is opens
    assert bool(found.json()["data"]) is opens  # a page that does not open is not found either


def remember(proxy) -> None:
    response = proxy.http.post(
        "/v1/chat/completions", json={"model": "m", "messages": HISTORY}, headers={"authorization": "Bearer sk-a", "x-pcp-memory": "plans"}
    )
    assert response.status_code == 200, response.text
    proxy.services.memory.wait()
    assert proxy.http.get("/v1/pcp/memory/plans", headers={"authorization": "Bearer sk-a"}).json()["originals"] > 0


@pytest.mark.embedded_store
def test_without_a_data_key_the_text_is_stored_as_it_is(start_proxy, tmp_path):
    proxy = start_proxy(sentry_threshold=300)
    ask(proxy, asking())
    proxy.stop()
    assert SECRET_WORD.encode() in _stored_bytes(tmp_path)  # what the key changes


@pytest.mark.parametrize("later", [{"data_key": KEY}, {"data_key": base64.b64encode(bytes(32)).decode()}, {}], ids=["same key", "another key", "no key"])
def test_a_session_sealed_under_a_key_opens_only_with_it_else_is_paged_again(start_proxy, tmp_path, later):
    first = start_proxy(sentry_threshold=300, data_key=KEY)
    answered = ask(first, asking())
    first.stop()
    again = start_proxy(sentry_threshold=300, **later)
    ask(again, following(answered))
    how = "resumed" if later.get("data_key") == KEY else "new"
    assert metric_value(again.http.get("/metrics").text, "pcp_sessions_total", how=how) == 1


def test_sessions_stored_before_a_key_was_set_still_open(start_proxy):
    first = start_proxy(sentry_threshold=300)
    answered = ask(first, asking())
    first.stop()
    again = start_proxy(sentry_threshold=300, data_key=KEY)
    ask(again, following(answered))
    assert metric_value(again.http.get("/metrics").text, "pcp_sessions_total", how="resumed") == 1


def test_a_sealed_value_is_bound_to_its_key_in_the_store():
    sealer = Sealer(data_key(KEY))
    sealed = sealer.seal(b"text", "session\x1fns-a\x1fs-1")
    assert sealer.open(sealed, "session\x1fns-a\x1fs-1") == b"text"
    assert sealer.open(sealed, "session\x1fns-b\x1fs-1") is None  # moved under another caller's key


@pytest.mark.parametrize("bad", ["short", base64.b64encode(bytes(16)).decode(), "zz" * 32])
def test_a_data_key_that_is_not_32_bytes_stops_start_up_without_showing_it(bad):
    with pytest.raises(SettingsError) as error:
        load_settings(environ={"PCP_DATA_KEY": bad})
    assert "data_key" in str(error.value) and "32 bytes" in str(error.value) and bad not in str(error.value)


# -- what is open without a key -------------------------------------------------------------


def test_with_proxy_keys_metrics_and_health_details_need_one(start_proxy):
    proxy = start_proxy(api_keys=["pk-1"])
    assert proxy.http.get("/metrics").status_code == 401
    assert proxy.http.get("/metrics", headers={"authorization": "Bearer nope"}).status_code == 401
    assert proxy.http.get("/metrics", headers={"authorization": "Bearer pk-1"}).status_code == 200
    assert proxy.http.get("/healthz").json() == {"status": "ok"}  # liveness stays open
    assert proxy.http.get("/healthz", headers={"authorization": "Bearer nope"}).json() == {"status": "ok"}
    assert "upstream" in proxy.http.get("/healthz", headers={"authorization": "Bearer pk-1"}).json()


def test_a_metrics_key_opens_metrics_and_nothing_else(start_proxy):
    proxy = start_proxy(api_keys=["pk-1"], metrics_key="mk-1")
    assert proxy.http.get("/metrics", headers={"authorization": "Bearer pk-1"}).status_code == 401
    assert proxy.http.get("/metrics", headers={"authorization": "Bearer mk-1"}).status_code == 200
    assert (
        proxy.http.post(
            "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, headers={"authorization": "Bearer mk-1"}
        ).status_code
        == 401
    )


def test_without_proxy_keys_both_are_open(start_proxy):
    proxy = start_proxy()
    assert proxy.http.get("/metrics").status_code == 200
    assert "upstream" in proxy.http.get("/healthz").json()
