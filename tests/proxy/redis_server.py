"""A real ``redis-server`` for the tests that need one: on a free loopback port, in a temporary dir, append-only.

Debian's ``redis-server`` (``.ci/run`` installs it when it is missing). A test
that asks for one is skipped, saying why, only when it cannot be started.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.proxy.helpers import NotYet, eventually, free_port

__all__ = ["RedisServer"]


class RedisServer:
    """One ``redis-server`` process; ``restart`` stops it (SIGTERM: it writes its file) and starts it again on the same port and dir."""

    def __init__(self, directory: Path):
        binary = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run installs it)")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            eventually(self._answers, timeout=10, awaiting="redis-server to answer PING")
        except NotYet:
            self.stop()
            pytest.skip("redis-server did not answer within 10 s")

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.skip(f"redis-server could not be started (exit {self.process.returncode}; see {self.directory / 'redis.log'})")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)
