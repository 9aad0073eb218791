"""A scripted OpenAI-compatible upstream on loopback, for tests and benchmarks (``testing_apis``: the Responses and Messages APIs).

It is a real HTTP server (uvicorn in a thread), so what it records is what
crossed the wire::

    with FakeUpstream() as upstream:
        upstream.enqueue(completion("hello"))
        ...  # point the proxy at upstream.url
        upstream.requests[-1].json["messages"]

A reply is a ``Reply`` or a function from the ``Recorded`` request to one, which
lets a test play a model that reads its prompt (see ``bench/`` for a simulated worker).

``paged_session`` pages a conversation as the host does, for what stores sessions.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import uvicorn

from pcp_core.session import Session, chain_links, page_on, resume

from ..headers import ROLE
from .apis import default_reply
from .embedder import StandInEmbedder
from .replies import Recorded, Reply, by_role, completion, embeddings, embeddings_reply, sse_chunks, stream_reply

__all__ = [
    "EMBEDDING_DONE",
    "SUMMARY_DONE",
    "FakeUpstream",
    "Recorded",
    "Reply",
    "StandInEmbedder",
    "background_through",
    "by_role",
    "completion",
    "embeddings",
    "embeddings_reply",
    "metric_value",
    "paged_session",
    "serve_in_thread",
    "sse_chunks",
    "stream_reply",
    "wait_for_background",
]


def _embeddings_asked(body: bytes) -> Reply:
    """The answer to an embeddings request: a vector for each text, of the dimensions it asks (8 unless it says)."""
    asked = json.loads(body)
    texts = asked["input"] if isinstance(asked["input"], list) and isinstance(asked["input"][0], str) else [asked["input"]]
    return embeddings(len(texts), dimensions=int(asked.get("dimensions") or 8))


def _answer_in_kind(recorded: Recorded) -> Reply:
    """The default reply, in the API the call was made to."""
    return default_reply(recorded)


class FakeUpstream:
    """A loopback OpenAI-compatible server that answers from a script and records every request."""

    def __init__(self, default: Reply | Callable[[Recorded], Reply] | None = None):
        self.requests: list[Recorded] = []
        self.script: deque[Reply | Callable[[Recorded], Reply]] = deque()
        self.default = default or _answer_in_kind
        self.embeddings: Callable[[Recorded], Reply] | None = None  # answers /embeddings, outside the script
        self.disconnects = 0  # streams the client abandoned before the end
        self.finished_streams = 0
        self._server: _ThreadedServer | None = None

    # -- scripting ---------------------------------------------------------
    def enqueue(self, *replies: Reply | Callable[[Recorded], Reply]) -> None:
        """Script the next replies, in order."""
        self.script.extend(replies)

    def chat_requests(self, role: str | None = None) -> list[Recorded]:
        """The chat completion calls received (those of ``role``, when given)."""
        return [r for r in self.requests if r.path.endswith("/chat/completions") and (role is None or r.headers.get(ROLE) == role)]

    def reply_to(self, recorded: Recorded) -> Reply:
        """Record ``recorded`` and answer it from the script."""
        self.requests.append(recorded)
        if recorded.path.endswith("/embeddings") and self.embeddings is not None:
            return self.embeddings(recorded)
        if recorded.path.endswith("/models"):
            return Reply(body=json.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": "pcp-tests"}]}).encode())
        if recorded.path.endswith("/embeddings") and not self.script:
            return _embeddings_asked(recorded.body)
        scripted = self.script.popleft() if self.script else self.default
        return scripted(recorded) if callable(scripted) else scripted

    # -- lifecycle ---------------------------------------------------------
    @property
    def url(self) -> str:
        """Where the upstream answers: on loopback once started, else in process (``transport``)."""
        return f"{self._server.url}/v1" if self._server is not None else f"{IN_PROCESS}/v1"

    def transport(self) -> httpx.AsyncBaseTransport:
        """The upstream in process: what the proxy sends it never touches a socket."""
        return _InProcess(self)

    def start(self) -> FakeUpstream:
        """Serve on a free port, in a thread."""
        self._server = serve_in_thread(self._asgi)
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server:
            self._server.stop()

    def __enter__(self) -> FakeUpstream:
        """Start serving."""
        return self.start()

    def __exit__(self, *_: object) -> None:
        """Stop serving."""
        self.stop()

    # -- the server --------------------------------------------------------
    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI app: the call recorded, then its reply sent."""
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        reply = self.reply_to(Recorded(scope["method"], scope["path"], headers, body, scope.get("query_string", b"").decode()))
        if reply.delay:
            await asyncio.sleep(reply.delay)
        raw_headers = [(k.encode(), v.encode()) for k, v in reply.headers.items()]
        if reply.chunks is None:
            raw_headers.append((b"content-length", str(len(reply.body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": raw_headers})
        if reply.chunks is None:
            await send({"type": "http.response.body", "body": reply.body})
            return
        await self._stream(reply.chunks, send, receive)

    async def _stream(self, chunks: list[bytes | float | threading.Event], send: Any, receive: Any) -> None:
        """Send a streamed reply's chunks, pauses and waits, until done or the client leaves."""
        gone = asyncio.ensure_future(_until_disconnect(receive))
        try:
            for item in chunks:
                if isinstance(item, float):
                    await asyncio.wait([gone], timeout=item)
                elif isinstance(item, threading.Event):
                    deadline = time.monotonic() + 10
                    while not item.is_set() and not gone.done() and time.monotonic() < deadline:
                        await asyncio.sleep(0.005)
                else:
                    await send({"type": "http.response.body", "body": item, "more_body": True})
                if gone.done():
                    self.disconnects += 1
                    return
            await send({"type": "http.response.body", "body": b""})
            self.finished_streams += 1
        except OSError:
            self.disconnects += 1
        finally:
            gone.cancel()


IN_PROCESS = "http://upstream.test"


class _InProcess(httpx.AsyncBaseTransport):
    def __init__(self, fake: FakeUpstream):
        self.fake = fake

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """The call recorded and answered in process, as the served fake would."""
        body = await request.aread()
        headers = {k.lower(): v for k, v in request.headers.items()}
        reply = self.fake.reply_to(Recorded(request.method, request.url.path, headers, body, request.url.query.decode()))
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.chunks is None:
            return httpx.Response(reply.status, headers={**reply.headers, "content-length": str(len(reply.body))}, stream=httpx.ByteStream(reply.body))
        return httpx.Response(reply.status, headers=reply.headers, stream=_Chunks(self.fake, reply.chunks))


class _Chunks(httpx.AsyncByteStream):
    """A scripted stream's body; a reader that closes it before the end counts as a disconnect."""

    def __init__(self, fake: FakeUpstream, chunks: list[bytes | float | threading.Event]):
        self.fake, self.chunks, self.finished = fake, chunks, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        """The reply's chunks, with its pauses and waits."""
        for item in self.chunks:
            if isinstance(item, float):
                await asyncio.sleep(item)
            elif isinstance(item, threading.Event):
                deadline = time.monotonic() + 10
                while not item.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
            else:
                yield item
        self.finished = True
        self.fake.finished_streams += 1

    async def aclose(self) -> None:
        """Count a client that left before the end."""
        if not self.finished:
            self.fake.disconnects += 1
            self.finished = True


async def _until_disconnect(receive: Any) -> None:
    """Wait until the client goes away."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _ThreadedServer:
    def __init__(self, app: Any, **config: Any):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        host, port = self.sock.getsockname()
        self.url = f"http://{host}:{port}"
        options = {"log_level": "warning", "lifespan": "auto", "access_log": False, "interface": "asgi3", **config}
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server for {app!r} did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop serving."""
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


def serve_in_thread(app: Any, **config: Any) -> _ThreadedServer:
    """Serve an ASGI app on a free loopback port in a background thread."""
    return _ThreadedServer(app, **config)


# The states of pcp_texts_embedded_total (and of pcp_summaries_total) in which queued work is through.
EMBEDDING_DONE = ("encoded", "loaded", "elsewhere", "failed", "shed")
SUMMARY_DONE = ("landed", "failed")


def metric_value(exposition: str, name: str, **labels: str) -> int:
    """A counter's value in the proxy's ``/metrics`` text (0 when it has not been counted)."""
    rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    line = f"{name}{{{rendered}}} " if rendered else f"{name} "
    return next((int(row.removeprefix(line)) for row in exposition.splitlines() if row.startswith(line)), 0)


def background_through(exposition: str, name: str, done: Sequence[str]) -> bool:
    """Whether the background work counted by ``name`` in ``/metrics`` is through: its ``state="queued"``
    count reached by the sum of the ``done`` states."""
    return metric_value(exposition, name, state="queued") <= sum(metric_value(exposition, name, state=state) for state in done)


def wait_for_background(read_metrics: Callable[[], str], name: str, done: Sequence[str], timeout: float = 600.0) -> float:
    """Seconds until the proxy's background work counted by ``name`` is through (``background_through``);
    ``read_metrics`` returns the ``/metrics`` text. For the benches: they report the time."""
    start = time.monotonic()
    while True:
        if background_through(read_metrics(), name, done):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{name}: background work still queued after {timeout:.0f} s")
        time.sleep(0.05)


def paged_session(messages: Sequence[dict[str, Any]], count: Callable[[str], int], known: Session | None = None, session_id: str = "s-1") -> Session:
    """The session of ``messages``, paged as the host pages it (as a follow-up of ``known``, when given)."""
    chain = chain_links(messages)
    reused = len(known.chain) if known else 0
    session = resume(known, reused, chain, "2026-11-23T08:00:00", session_id)
    return page_on(session, messages, reused, count)


def main(argv: list[str] | None = None) -> None:
    """``python -m proxy.testing --port N``: a fake upstream in its own process (for benchmarks)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    fake = FakeUpstream()
    uvicorn.run(fake._asgi, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, interface="asgi3")


if __name__ == "__main__":
    main()
