"""A request's memory scope: the ``x-pcp-memory`` header, or (``memory_scope_from_user``) the body's ``user``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from pcp_core import SESSION_ID, short_hash

from .. import headers as pcp
from ..errors import ClientError
from .store import scope_key

__all__ = ["HEADER", "Scope", "checked_scope", "request_scope"]

HEADER = pcp.MEMORY


class Scope(msgspec.Struct, frozen=True):
    name: str  # as the client names it (the API's path, the response header)
    key: str  # the store's: the caller's namespace before the name


class _User(msgspec.Struct):
    user: object = None


def checked_scope(name: str, param: str = HEADER) -> str:
    """``name`` if it is a valid scope name, else a 400 naming ``param``."""
    if not SESSION_ID.fullmatch(name):
        raise ClientError(f"{param} must be 1 to 128 letters, digits or . _ : -, got {name[:40]!r}", param=param, code="invalid_memory_scope")
    return name


def request_scope(headers: Mapping[str, str], body: bytes, namespace: Callable[[], str], from_user: bool) -> Scope | None:
    """The scope a chat request reads and writes memory in; None: no memory at all.

    A ``user`` that is not a valid scope name (an e-mail address, say) is
    scoped by its hash, ``u-<hash>``; the response's ``x-pcp-memory`` says which.
    ``namespace`` computes the caller's (a keyed hash: only for a request with a scope).
    """
    name = headers.get(HEADER)
    if name is not None:
        return Scope(checked_scope(name), scope_key(namespace(), name))
    if not from_user:
        return None
    try:
        user = msgspec.json.decode(body, type=_User).user
    except msgspec.DecodeError:
        return None  # the body's own errors are reported where it is read
    if not isinstance(user, str) or not user:
        return None
    name = user if SESSION_ID.fullmatch(user) else "u-" + short_hash(user, length=16)
    return Scope(name, scope_key(namespace(), name))
