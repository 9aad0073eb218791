"""An upstream that misbehaves on a raw socket: it answers every request with a scripted run of bytes, pauses, cuts and resets.

An HTTP server cannot send a lying Content-Length, stop a chunked body midway
or reset a connection on purpose; this one does nothing else::

    with FaultyUpstream() as upstream:
        upstream.play = lambda request: [head(200, "application/json", length=1000), b'{"id": ', CLOSE]

A script is a list of steps: bytes are sent, a float is a pause in seconds,
``CLOSE`` ends the connection cleanly (FIN) and ``RESET`` aborts it (RST).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CLOSE", "RESET", "FaultyUpstream", "Request", "chunk", "event", "head"]

CLOSE = "close"
RESET = "reset"
Step = bytes | float | str


@dataclass
class Request:
    head: bytes
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def head(status: int = 200, content_type: str = "application/json", *, length: int | None = None, chunked: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} Whatever", f"content-type: {content_type}", "connection: close"]
    lines += [f"content-length: {length}"] if length is not None else []
    lines += ["transfer-encoding: chunked"] if chunked else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (b"" is the last chunk)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(payload: Any) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"


class FaultyUpstream:
    def __init__(self, play: Callable[[Request], list[Step]] | None = None):
        self.play = play or (lambda _: [RESET])
        self.requests: list[Request] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.stopping = threading.Event()

    def __enter__(self) -> FaultyUpstream:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            request = _read_request(conn)
            if request is None:
                return
            self.requests.append(request)
            for step in self.play(request):
                if step == RESET:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    break
                if step == CLOSE:
                    break
                if isinstance(step, float):
                    if self.stopping.wait(step):
                        break
                else:
                    conn.sendall(step)  # type: ignore[arg-type]
        except OSError:  # the proxy went away first: what a client of a faulty upstream does
            pass
        finally:
            conn.close()


def _read_request(conn: socket.socket) -> Request | None:
    data = b""
    while b"\r\n\r\n" not in data:
        received = conn.recv(65536)
        if not received:
            return None
        data += received
    head_, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head_.split(b"\r\n")[1:] if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        received = conn.recv(65536)
        if not received:
            break
        body += received
    return Request(head_, body)
