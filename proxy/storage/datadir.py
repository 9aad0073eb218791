"""The data dir: private to the proxy's user, and the install's own secret in it, which names the callers' namespaces.

Sessions are kept per caller, in a *namespace*: a keyed hash (HMAC-SHA-256,
128 bits shown) of the caller's normalised credential, under a secret made
once per install (``PCP_DATA_DIR/install-secret``, 32 random bytes, 0600).
Without the secret a namespace cannot be tied to a key, even by one who holds
both the key and the data dir's listing; and two ways of writing one key
(``bearer K``, ``Bearer  K``) are one namespace.

With a shared store (``PCP_STORE``) the secret is the store's
(``redis_store.SharedSecret``), and the data dir keeps a copy of it
(``store-secret``), which is written back to a store that lost it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["Namespaces", "install_secret", "keep_secret_copy", "normalised_credential", "private_dir", "private_tree", "secret_copy"]

SECRET_FILE = "install-secret"
STORE_SECRET_FILE = "store-secret"  # with a shared store: this process's copy of the store's secret
SECRET_BYTES = 32
NAMESPACE_HEX = 32  # 128 bits: no two of billions of keys meet
CACHE_KEY_HEX = 32  # a prompt cache key's hash: "pcp-" and 32 hex digits, well within OpenAI's 64 characters
HANDLE_PREFIX = "pcp-pages.v1."  # a compaction's handle to the pages it stands for
HANDLE_SIGNATURE_HEX = 32


def private_dir(path: Path) -> Path:
    """``path``, made if need be, readable and writable by this user alone (0700)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)  # made by an older version, or by hand
    return path


def private_tree(path: Path) -> Path:
    """``path`` (made if need be) and everything under it private to this user: directories 0700, files 0600.

    For what a store made with the process's umask (SQLite's files, diskcache's
    value files) or an older version left open. ``pcp-proxy serve`` also sets
    the umask to 077, so what is made later is private from the start.
    """
    private_dir(path)
    for root, dirs, files in os.walk(path):
        for name, mode in [*((d, 0o700) for d in dirs), *((f, 0o600) for f in files)]:
            _private(Path(root, name), mode)
    return path


def _private(entry: Path, mode: int) -> None:
    """``entry`` at ``mode`` if others may read it. One gone since the walk listed it (SQLite's journal, as
    another worker on the same data dir commits) is left alone: a start must not fail on it."""
    try:
        if not entry.is_symlink() and entry.stat().st_mode & 0o077:
            entry.chmod(mode)
    except FileNotFoundError:
        pass


def install_secret(data_dir: Path) -> bytes:
    """The install's secret: read from the data dir, or made there the first time (0600, made once even by two processes).

    Made whole or not at all: written and synced under a name of its own, then linked to its
    place, which fails if another process linked its own first (that one is read).
    """
    path = private_dir(data_dir) / SECRET_FILE
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    made = _written(path, os.urandom(SECRET_BYTES))
    try:
        os.link(made, path)
    except FileExistsError:
        return _read_secret(path)
    finally:
        made.unlink()
    _synced_dir(path.parent)
    return path.read_bytes()


def secret_copy(data_dir: Path) -> bytes | None:
    """The copy of the shared store's secret this data dir keeps (``STORE_SECRET_FILE``); None if there is none whole."""
    try:
        secret = (data_dir / STORE_SECRET_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return secret if len(secret) == SECRET_BYTES else None


def keep_secret_copy(data_dir: Path, secret: bytes) -> None:
    """Keep ``secret`` as the data dir's copy of the shared store's: replaced whole (written, synced, renamed), 0600."""
    path = private_dir(data_dir) / STORE_SECRET_FILE
    os.replace(_written(path, secret), path)
    _synced_dir(path.parent)


def _read_secret(path: Path) -> bytes:
    """The install's secret from ``path``, or the error that says it is damaged."""
    secret = path.read_bytes()
    if len(secret) != SECRET_BYTES:
        raise RuntimeError(f"{path} is not {SECRET_BYTES} bytes: the install's secret is damaged (remove it to make a new one; sessions are then paged again)")
    return secret


def _written(path: Path, data: bytes) -> Path:
    """``data`` in a new file beside ``path`` (0600), synced to the disk."""
    made = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    return made


def _synced_dir(directory: Path) -> None:
    """A name linked or renamed in ``directory`` outlives a crash of the machine too."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def normalised_credential(headers: Mapping[str, str]) -> str:
    """The caller's credential, one way however it is written: ``Authorization`` (its scheme in
    lower case, spaces around the token dropped), else an ``api-key`` or ``x-api-key`` header; else none."""
    authorization = headers.get("authorization", "").split(None, 1)
    if authorization:
        return " ".join([authorization[0].lower(), *(part.strip() for part in authorization[1:])])
    for name in ("api-key", "x-api-key"):
        value = headers.get(name, "").strip()
        if value:
            return f"{name} {value}"
    return ""


class Namespaces:
    def __init__(self, secret: bytes):
        self.secret = secret

    def of(self, headers: Mapping[str, str]) -> str:
        """The namespace of the caller who sent ``headers``."""
        credential = normalised_credential(headers).encode()
        return hmac.new(self.secret, credential, hashlib.sha256).hexdigest()[:NAMESPACE_HEX]

    def cache_key(self, namespace: str, session_id: str) -> str:
        """The key a session's upstream calls are cached by (OpenAI's ``prompt_cache_key``): a keyed hash of the caller's
        namespace and the session, so that two callers who name one session (a client may choose its id) never share a
        provider's cache, and nothing the client wrote goes upstream in it. Stable: a session's follow-ups send the same."""
        message = b"\0".join([b"prompt-cache-key", namespace.encode(), session_id.encode(errors="surrogatepass")])
        return "pcp-" + hmac.new(self.secret, message, hashlib.sha256).hexdigest()[:CACHE_KEY_HEX]

    def handle(self, namespace: str, sessions: list[str]) -> str:
        """A compaction's handle to ``sessions`` (their pages), for the caller of ``namespace`` alone: the ids, and a keyed
        hash of them and the namespace under the install's secret. Opaque to a client, who cannot forge nor move it."""
        encoded = base64.urlsafe_b64encode(json.dumps(sessions, separators=(",", ":")).encode()).decode().rstrip("=")
        return f"{HANDLE_PREFIX}{encoded}.{self._signed(namespace, encoded)}"

    def opened(self, namespace: str, handle: str) -> list[str] | None:
        """The sessions ``handle`` stands for, when this install made it for the caller of ``namespace``; else None."""
        if not handle.startswith(HANDLE_PREFIX) or handle.count(".") != 3:
            return None
        encoded, signature = handle[len(HANDLE_PREFIX) :].split(".")
        if not hmac.compare_digest(signature, self._signed(namespace, encoded)):
            return None
        try:
            sessions = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        except ValueError:
            return None
        return [s for s in sessions if isinstance(s, str)] if isinstance(sessions, list) else None

    def _signed(self, namespace: str, encoded: str) -> str:
        """The signature of a handle's ``encoded`` sessions, bound to the caller's namespace."""
        message = b"\0".join([b"compaction-handle", namespace.encode(), encoded.encode()])
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()[:HANDLE_SIGNATURE_HEX]
