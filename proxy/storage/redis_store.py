"""The shared store: Redis (or Valkey), for workers and replicas that serve one set of conversations.

Every process keeps one client (``connect``) with a pool of connections,
shared by its stores; each store has its area, a key prefix (``pcp:s:`` for
sessions, ``pcp:v:`` for vectors, …), and the caller's namespace is the next
part of a key's name. The stores call Redis from their threads (a request's
paging thread, the writers), so they use the synchronous client: the event
loop never waits on Redis, and the paging thread, which already blocks on
the CPU, needs no loop of its own.

``commit`` is one Lua script: the version is compared and every write,
deletion and expiry applied in one step, which no other client sees half
done and which a client killed mid-way never leaves half done.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .base import Commit, Key, StoreUnavailable
from .datadir import STORE_SECRET_FILE, keep_secret_copy, secret_copy

__all__ = ["Announcements", "RedisStore", "SharedSecret", "StoreSettingError", "connect", "shown", "unavailable"]

log = logging.getLogger("pcp.store")

PREFIX = "pcp:"
POOL_SIZE = 64  # connections per process: the paging threads, the writers, the vector listener
# A store that does not answer within this many seconds is unavailable (a 503), not a hung request.
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0
_CHUNK = 512  # keys per MGET

_COMMIT = """
local held = redis.call('GET', KEYS[1]) or ''
if ARGV[1] ~= '*' and held ~= ARGV[1] then return 0 end
local ttl = tonumber(ARGV[3])
local writes = tonumber(ARGV[4])
local keep = tonumber(ARGV[5])
for i = 1, writes do
  if ttl > 0 then redis.call('SET', KEYS[1 + i], ARGV[5 + i], 'PX', ttl) else redis.call('SET', KEYS[1 + i], ARGV[5 + i]) end
end
if ttl > 0 then
  for i = 1, keep do redis.call('PEXPIRE', KEYS[1 + writes + i], ttl) end
end
local a = 6 + writes
while a < #ARGV do
  local n = tonumber(ARGV[a + 1])
  while redis.call('DEL', ARGV[a] .. n) == 1 do n = n + 1 end
  a = a + 2
end
if ttl > 0 then redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl) else redis.call('SET', KEYS[1], ARGV[2]) end
return 1
"""


class StoreSettingError(RuntimeError):
    """``PCP_STORE`` is malformed or the store it names cannot be reached at start: the message names the setting."""


def shown(url: str) -> str:
    """The store's URL without its password, for messages and the log."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a malformed port or host (settings refuse it first): what follows the last @
        scheme, _, rest = url.partition("://")
        return f"{scheme}://{rest.rpartition('@')[2]}"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def unavailable(error: BaseException) -> StoreUnavailable:
    """Redis' failure as the store's 503."""
    return StoreUnavailable(type(error).__name__)


def connect(url: str) -> Any:
    """A client for ``url`` with its pool, checked with a PING; ``StoreSettingError`` if it cannot be made or reached."""
    try:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry
    except ImportError:
        raise StoreSettingError("setting store (env PCP_STORE) names Redis but the redis package is not installed: pip install 'pcp-proxy[redis]'") from None
    # A blip is retried at once, twice; a store that is down is a 503 within the socket timeouts, not seconds of backoff.
    options = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "health_check_interval": 30,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
    }
    try:
        pool = redis.BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=SOCKET_TIMEOUT, **options)
        client = redis.Redis(connection_pool=pool)
        client.ping()
    except (ValueError, TypeError) as error:
        raise StoreSettingError(f"setting store (env PCP_STORE) is not a Redis URL the client can read ({shown(url)}): {error}") from None
    except redis.RedisError as error:
        raise StoreSettingError(f"setting store (env PCP_STORE): the Redis server at {shown(url)} cannot be reached: {error}") from None
    return client


class SharedSecret:
    """The install's secret in the store (``pcp:install-secret``), which names the callers' namespaces alike on every replica.

    The store may lose it (emptied, or restarted without its data) while the
    proxy runs, and every session written since would be named by a secret no
    later process knows. So a process holds on to the secret: in memory, and
    as a copy in its data dir (``store-secret``). It writes that back to a
    store that lost it, at start and every ``CHECK_SECONDS`` while it runs
    (``check``). It makes a new secret only for a store that has none and for
    which it holds no copy, and says so loudly if that store holds sessions.
    A store that holds another secret than the one a running process names
    its namespaces by (another process made one meanwhile) is logged as an
    error, and the process goes on naming them as it did.
    """

    KEY = PREFIX + "install-secret"
    CHECK_SECONDS = 5.0

    def __init__(self, client: Any, data_dir: Path):
        self.client = client
        self.data_dir = data_dir
        self.secret = b""
        self.other_secret: bytes | None = None  # the other secret the store holds, logged once

    def open(self) -> bytes:
        """The secret at start: the store's; else this data dir's copy, written back; else a new one."""
        import redis

        try:
            return self._open()
        except redis.RedisError as error:
            raise StoreSettingError(f"setting store (env PCP_STORE): the install secret could not be read or written at {self.KEY}: {error}") from None

    def _open(self) -> bytes:
        """The install's secret as the store holds it (written there from the data dir's copy if it has none)."""
        copy = secret_copy(self.data_dir)
        if copy is not None:
            if self.client.set(self.KEY, copy, nx=True):
                log.warning("the store had no install secret (%s): this data dir's copy was written back, so the namespaces keep their names", self.KEY)
        elif self.client.get(self.KEY) is None:
            if self._holds_sessions():
                log.error(
                    "the store holds sessions but no install secret (%s), and this data dir has no copy of it: a new secret is made, "
                    "and the sessions kept under the old one are found by no key (they are paged again). Restore %s from a backup of "
                    "the store, or %s/%s from a proxy's data dir, to keep them.",
                    self.KEY,
                    self.KEY,
                    self.data_dir,
                    STORE_SECRET_FILE,
                )
            self.client.set(self.KEY, os.urandom(32), nx=True)  # the first of several processes to get here makes it
        secret = self.client.get(self.KEY)
        if not isinstance(secret, bytes) or len(secret) != 32:
            raise StoreSettingError(
                f"setting store (env PCP_STORE): {self.KEY} in the store is not 32 bytes (delete it to make a new one; sessions are then paged again)"
            )
        if copy is not None and secret != copy:
            log.warning("the store's install secret is not this data dir's copy (was it run against another store?): the store's names the namespaces")
        if secret != copy:
            try:
                keep_secret_copy(self.data_dir, secret)
            except OSError as error:
                log.warning(
                    "the install secret's copy could not be kept in the data dir (%s): a store that loses it gets it back only from a running proxy", error
                )
        self.secret = secret
        return secret

    def check(self) -> None:
        """The store still holds the secret this process names namespaces by: written back if the store lost it, refused if another is there."""
        if self.client.set(self.KEY, self.secret, nx=True):
            log.warning("the store had lost the install secret (%s; emptied, or restarted without its data): written back", self.KEY)
            return
        held = self.client.get(self.KEY)
        if held is not None and held != self.secret and held != self.other_secret:
            self.other_secret = held
            log.error(
                "the store holds another install secret (%s) than this process names the namespaces by: it lost the secret and another "
                "process made a new one. This process goes on with the namespaces it had; processes that started since name them "
                "otherwise, and see none of their sessions. To make them one again, set %s back to the old secret (this data dir's "
                "%s holds it) and restart the processes that started since.",
                self.KEY,
                self.KEY,
                STORE_SECRET_FILE,
            )

    def _holds_sessions(self) -> bool:
        """Whether the store holds any session."""
        return next(iter(self.client.scan_iter(match=f"{PREFIX}s:session:*", count=1000)), None) is not None


class RedisStore:
    """``Store`` in Redis, under ``pcp:<area>:``; ``ttl``: seconds a value is kept after it was last written (0: for ever)."""

    shared = True

    def __init__(self, client: Any, area: str, ttl: float = 0):
        import redis

        self.client = client
        self.prefix = f"{PREFIX}{area}:"
        self.ttl_ms = int(ttl * 1000)
        self._commit = client.register_script(_COMMIT)
        self._errors = (redis.ConnectionError, redis.TimeoutError)  # BusyLoadingError (a restart reading its file) is one

    def name(self, key: Key) -> str:
        """A key's name in Redis."""
        return self.prefix + ":".join(k.hex() if isinstance(k, bytes) else str(k) for k in key)

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args)``, Redis' failures as the store's 503."""
        try:
            return method(*args, **kwargs)
        except self._errors as error:
            raise unavailable(error) from None

    def get(self, key: Key) -> bytes | None:
        """The value at ``key``; None: none."""
        return self._call(self.client.get, self.name(key))

    def get_many(self, keys: Sequence[Key]) -> list[bytes | None]:
        """The values at ``keys``, in order (in chunks of MGET)."""
        names = [self.name(k) for k in keys]
        found: list[bytes | None] = []
        for start in range(0, len(names), _CHUNK):
            found += self._call(self.client.mget, names[start : start + _CHUNK])
        return found

    def set_many(self, items: Mapping[Key, bytes]) -> None:
        """Write every item, in one pipeline."""
        if not items:
            return
        pipe = self.client.pipeline(transaction=False)
        for key, value in items.items():
            pipe.set(self.name(key), value, px=self.ttl_ms or None)
        self._call(pipe.execute)

    def delete(self, key: Key) -> None:
        """Remove ``key``."""
        self._call(self.client.delete, self.name(key))

    def contains(self, key: Key) -> bool:
        """Whether ``key`` holds a value."""
        return bool(self._call(self.client.exists, self.name(key)))

    def claim(self, key: Key, seconds: float) -> bool:
        """Hold ``key`` for ``seconds`` unless another holds it: whether this did."""
        return bool(self._call(self.client.set, self.name(key), b"", nx=True, px=max(int(seconds * 1000), 1)))

    def commit(self, commit: Commit) -> bool:
        """Write a commit's items if the version is the one it expects, atomically (a Lua script): whether it was."""
        writes = list(commit.writes.items())
        keys = [self.name(commit.version), *(self.name(k) for k, _ in writes), *(self.name(k) for k in commit.keep)]
        args: list[Any] = [commit.expected, commit.new, self.ttl_ms, len(writes), len(commit.keep), *(v for _, v in writes)]
        for first in commit.trims:
            args += [self.name(first[:-1]) + ":", int(first[-1])]
        return bool(self._call(self._commit, keys=keys, args=args))

    def keys(self, kind: str) -> Iterator[Key]:
        """Every key of ``kind``."""
        start = len(self.prefix)
        for name in self._call(lambda: list(self.client.scan_iter(match=f"{self.prefix}{kind}:*", count=1000))):
            yield tuple(name.decode()[start:].split(":", 2))

    def announcements(self, name: str) -> Announcements:
        """The stream ``name`` of announcements between processes."""
        return Announcements(self, name)

    def close(self) -> None:
        """Nothing: the client is the process's."""
        pass  # the client is the process's (``Stores.close`` ends it)


class Announcements:
    """A Redis stream of payloads one process publishes and every other reads (the digests of vectors just encoded)."""

    KEEP = 200_000  # entries kept, about: a process that starts reads the latest of them

    def __init__(self, store: RedisStore, name: str):
        self.store = store
        self.stream = f"{store.prefix}{name}"

    def publish(self, payload: bytes) -> None:
        """Announce ``payload`` to the other processes."""
        self.store._call(self.store.client.xadd, self.stream, {b"d": payload}, maxlen=self.KEEP, approximate=True)

    def latest(self, count: int) -> tuple[bytes, list[bytes]]:
        """The position of the newest entry, and the payloads of the latest ``count``."""
        entries = self.store._call(self.store.client.xrevrange, self.stream, count=count)
        return (entries[0][0] if entries else b"0-0"), [fields[b"d"] for _, fields in reversed(entries)]

    def read(self, after: bytes, block_seconds: float) -> tuple[bytes, list[bytes]]:
        """The payloads published after ``after`` (waiting up to ``block_seconds`` for one), and the new position."""
        answer = self.store._call(self.store.client.xread, {self.stream: after}, block=int(block_seconds * 1000), count=1000)
        entries = answer[0][1] if answer else []
        return (entries[-1][0] if entries else after), [fields[b"d"] for _, fields in entries]
