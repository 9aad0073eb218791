"""An upstream that fails, every way a socket can: the client always learns of it, in both modes, streamed or not.

The fault-injecting upstream (``tests/faulty_upstream.py``) answers on a raw
socket: cut, reset, trickled, silent, of the wrong content type, an error
event, a lying length, broken framing. Whatever it does, the client gets
either an error status in the envelope, before the first byte, or, once its
stream has started, an error event with no ``[DONE]`` after it — never a
200 that hides the failure. Passthrough relays an upstream's *complete*
answer as it came, however odd (that is the upstream speaking); protocol
mode reads it, so an answer that is not a completion is a failure there too.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.proxy.faulty_upstream import CLOSE, RESET, FaultyUpstream, chunk, event, head

COMPLETION = json.dumps(
    {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}]}
).encode()
HELLO = event({"id": "c", "choices": [{"index": 0, "delta": {"content": "Hello, this is the start of a long answer that goes on and on " * 3}}]})
ERROR = event({"error": {"message": "the model is overloaded", "type": "server_error"}})
EMPTY = event({"id": "c", "choices": []})
DONE = b"data: [DONE]\n\n"
HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} about gardens, budgets and the river trip {i}"} for i in range(60)]


@dataclass(frozen=True)
class Fault:
    """What the upstream does: ``steps`` for a streamed call and for one that is not.

    ``relayed``: a complete HTTP answer (passthrough passes its body on as it
    came); None: the exchange itself broke, which both modes must report.
    """

    streamed: tuple
    whole: tuple
    relayed: tuple[bytes, bytes] | None = None  # (streamed body, whole body) as the client should get them in passthrough


def sse(*events: bytes, end: bool = True) -> tuple:
    return (head(200, "text/event-stream", chunked=True), *map(chunk, events), *((chunk(b""),) if end else ()))


def whole(body: bytes, content_type: str = "application/json", status: int = 200) -> tuple:
    return (head(status, content_type, length=len(body)), body)


FAULTS = {
    "reset at once": Fault((RESET,), (RESET,)),
    "closed at once": Fault((CLOSE,), (CLOSE,)),
    "cut in the head": Fault((b"HTTP/1.1 200 OK\r\ncontent-ty", CLOSE), (b"HTTP/1.1 200 OK\r\ncontent-ty", CLOSE)),
    "lying length": Fault((head(200, "text/event-stream", length=5000), HELLO, CLOSE), (head(200, "application/json", length=5000), COMPLETION[:30], CLOSE)),
    "reset midway": Fault((*sse(HELLO, end=False), RESET), (head(length=len(COMPLETION)), COMPLETION[:40], RESET)),
    "cut midway": Fault((*sse(HELLO, end=False), CLOSE), (head(length=len(COMPLETION)), COMPLETION[:40], CLOSE)),
    "cut mid-event": Fault((*sse(HELLO, end=False), chunk(b'data: {"choices": [{"del'), CLOSE), (head(chunked=True), chunk(COMPLETION[:40]), CLOSE)),
    "broken framing": Fault(
        (head(200, "text/event-stream", chunked=True), chunk(HELLO), b"zz\r\nnot a chunk\r\n", CLOSE), (head(chunked=True), b"zz\r\n{}\r\n", CLOSE)
    ),
    "trickle": Fault(
        (head(200, "text/event-stream", chunked=True), *[step for _ in range(200) for step in (chunk(b":\n"), 0.05)]),
        (head(chunked=True), *[step for _ in range(200) for step in (chunk(b" "), 0.05)]),
    ),
    "silence": Fault((head(200, "text/event-stream", chunked=True), chunk(HELLO), 20.0), (head(chunked=True), 20.0)),
    "html": Fault(
        whole(b"<html>502 Bad Gateway</html>", "text/html"), whole(b"<html>502 Bad Gateway</html>", "text/html"), relayed=(b"<html>502 Bad Gateway</html>",) * 2
    ),
    "json to a stream": Fault(
        whole(b'{"error": {"message": "streaming is off"}}'),
        whole(b'{"error": {"message": "oops"}}'),
        relayed=(b'{"error": {"message": "streaming is off"}}', b'{"error": {"message": "oops"}}'),
    ),
    "error event": Fault(sse(HELLO, ERROR), sse(ERROR), relayed=(HELLO + ERROR, ERROR)),
    "only an error event": Fault(sse(ERROR), sse(ERROR), relayed=(ERROR, ERROR)),
    "no events": Fault(sse(DONE), whole(b""), relayed=(DONE, b"")),
    "no choices": Fault(sse(EMPTY, DONE), whole(b'{"id": "c", "choices": []}'), relayed=(EMPTY + DONE, b'{"id": "c", "choices": []}')),
    "ends before its answer": Fault(sse(HELLO), whole(b'{"id": "c", "choi'), relayed=(HELLO, b'{"id": "c", "choi')),
}


@pytest.fixture(scope="module")
def faulty():
    with FaultyUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def proxies(faulty, tmp_path_factory):
    from proxy.app import create_app
    from proxy.settings import Settings
    from proxy.testing.upstream import serve_in_thread

    servers = {}
    for mode, threshold in (("passthrough", 1_000_000), ("protocol", 200)):
        settings = Settings(
            upstream_base_url=faulty.url,
            data_dir=str(tmp_path_factory.mktemp(mode)),
            router_embeddings=False,
            sentry_threshold=threshold,
            context_budget=700,
            max_rounds=2,
            upstream_read_timeout=1.0,
            upstream_total_timeout=2.0,
        )
        servers[mode] = serve_in_thread(create_app(settings))
    yield {mode: server.url for mode, server in servers.items()}
    for server in servers.values():
        server.stop()


@dataclass
class Seen:
    status: int
    content_type: str
    body: bytes
    cut: bool  # the connection ended before the body did


def send(url: str, stream: bool) -> Seen:
    body = {"model": "m", "messages": [*HISTORY, {"role": "user", "content": "What about the river trip?"}], "stream": stream}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers={"authorization": "Bearer k"}, timeout=15) as response:
        received, cut = b"", False
        try:
            for data in response.iter_raw():
                received += data
        except httpx.RemoteProtocolError:
            cut = True
        return Seen(response.status_code, response.headers.get("content-type", ""), received, cut)


def assert_reported(seen: Seen) -> None:
    """The failure reached the client: an envelope status, or an error event that ends its stream."""
    if seen.status >= 400:
        error = json.loads(seen.body)["error"]
        assert {"message", "type", "param", "code"} <= set(error) and "internal proxy error" not in error["message"], seen
        return
    assert seen.status == 200 and seen.content_type.startswith("text/event-stream") and not seen.cut, seen
    last = seen.body.rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: {") and "error" in json.loads(last[6:]), f"a 200 that hides the failure: {seen.body[-300:]!r}"
    assert DONE not in seen.body


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("mode", ["passthrough", "protocol"])
@pytest.mark.parametrize("name", list(FAULTS))
def test_an_upstream_failure_reaches_the_client_as_a_failure(faulty, proxies, name, mode, stream):
    fault = FAULTS[name]
    faulty.play = lambda request: list(fault.streamed if (request.json or {}).get("stream") else fault.whole)
    seen = send(proxies[mode], stream)
    if mode == "passthrough" and fault.relayed is not None:
        assert seen.body == fault.relayed[0 if stream else 1] and not seen.cut, seen  # the upstream's own answer, as it came
    elif mode == "passthrough" and not stream and seen.cut:
        pass  # cannot happen: an unstreamed answer is read whole before the client gets a byte
    else:
        assert_reported(seen)


@pytest.mark.parametrize("mode", ["passthrough", "protocol"])
def test_a_status_of_the_upstreams_own_is_passed_on(faulty, proxies, mode):
    faulty.play = lambda _: list(whole(b'{"error": {"message": "rate limited"}}', status=429))
    for stream in (True, False):
        seen = send(proxies[mode], stream)
        assert seen.status == 429 and json.loads(seen.body)["error"]["message"] == "rate limited"


def test_a_passthrough_stream_cut_midway_ends_in_an_error_event_after_the_events_before_it(faulty, proxies):
    faulty.play = lambda _: [*sse(HELLO, HELLO, end=False), chunk(b'data: {"choices": [{"del'), RESET]
    seen = send(proxies["passthrough"], stream=True)
    events = seen.body.split(b"\n\n")
    assert events[:2] == [HELLO.rstrip(b"\n"), HELLO.rstrip(b"\n")]  # whole events as they came; the half one is dropped
    assert b"broke off" in events[2] and DONE not in seen.body


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("mode", ["passthrough", "protocol"])
def test_a_trickling_upstream_is_cut_at_its_total_timeout(faulty, proxies, mode, stream):
    fault = FAULTS["trickle"]
    faulty.play = lambda request: list(fault.streamed if (request.json or {}).get("stream") else fault.whole)
    start = time.monotonic()
    seen = send(proxies[mode], stream)
    assert time.monotonic() - start < 4.5  # upstream_total_timeout is 2 s; the trickle would last 10
    assert seen.status == 504 and json.loads(seen.body)["error"]["code"] == "upstream_timeout"
