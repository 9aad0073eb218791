"""``pcp-proxy serve --workers N``: N processes serving one port, each a whole proxy sharing the store.

Each worker binds the port itself with ``SO_REUSEPORT``, so the kernel spreads
new connections over the workers evenly. (With one listening socket shared
by all, as uvicorn's own ``--workers`` has it, the first worker to wake takes
every connection waiting — asyncio drains the backlog — and with keep-alive
clients one worker served them all while the other idled.) The parent only
watches: a worker that dies is started again; SIGTERM or SIGINT stops them all.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import time
from typing import Any

import msgspec

from ..settings import Settings

__all__ = ["serve_workers"]

log = logging.getLogger("pcp.proxy")

RESTART_PAUSE = 0.5  # seconds before a worker that died is started again
STARTUP_GRACE = 5.0  # a worker that fails this soon after start does not come back: the next would too


def _listening(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` that other workers may bind too (``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _worker(encoded: bytes) -> None:
    """One worker: its own socket on the port, its own app (``create_app``), under uvicorn."""
    import uvicorn

    from ..app import create_app
    from ..logs import configure_logging
    from .process import tune_process
    from .server import server_options

    settings = msgspec.json.decode(encoded, type=Settings)
    configure_logging(settings.log_level, settings.log_format)
    tune_process(settings)
    own_log: dict[str, Any] = {"log_config": None} if settings.log_format == "json" else {}
    config = uvicorn.Config(create_app(settings), log_level=settings.log_level, access_log=False, **own_log, **server_options(settings))
    uvicorn.Server(config).run(sockets=[_listening(settings.host, settings.port)])


def serve_workers(settings: Settings) -> int:
    """Run ``settings.workers`` workers until SIGTERM or SIGINT; the exit status (1 if workers kept dying at start)."""
    encoded = msgspec.json.encode(settings)
    context = multiprocessing.get_context("spawn")  # fresh interpreters: nothing of this one's state is shared
    _listening(settings.host, settings.port).close()  # the port is ours to share (or the error says why, now)
    stopping = False

    def stop(*_: Any) -> None:
        """On SIGTERM or SIGINT: the workers are to stop."""
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    workers: list[tuple[Any, float]] = []
    for _ in range(settings.workers):
        process = context.Process(target=_worker, args=(encoded,), daemon=False)
        process.start()
        workers.append((process, time.monotonic()))
    log.info(
        "pcp-proxy serving http://%s:%d with %d workers (pids %s)", settings.host, settings.port, settings.workers, ", ".join(str(p.pid) for p, _ in workers)
    )
    status = 0
    while not stopping:
        time.sleep(0.2)
        for i, (process, started) in enumerate(workers):
            if process.is_alive() or stopping:
                continue
            if (process.exitcode or 0) > 0 and time.monotonic() - started < STARTUP_GRACE:  # it failed (not killed): so would another
                log.error("worker %d exited at start (status %s): stopping", process.pid, process.exitcode)
                stopping, status = True, 1
                break
            log.warning("worker %d died (status %s): starting another", process.pid, process.exitcode)
            time.sleep(RESTART_PAUSE)
            replacement = context.Process(target=_worker, args=(encoded,), daemon=False)
            replacement.start()
            workers[i] = (replacement, time.monotonic())
    for process, _ in workers:
        if process.is_alive() and process.pid is not None:
            os.kill(process.pid, signal.SIGTERM)
    for process, _ in workers:
        process.join(timeout=60)
    return status
