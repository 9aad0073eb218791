"""The proxy's own API for Hybrid mode, under ``/v1/pcp/sessions/{id}``:

* ``GET …/context`` is the session's snapshot as the model last left it (the
  header ``x-pcp-context-round`` carries its round);
* ``PUT …/todo`` sets the session's todo list (``{"items": [{"id", "title", "done"}]}``),
  from which the system computes ``todo.summary``, ``total`` and ``step``;
  ``GET …/todo`` reads it back.

Sessions are the caller's, named under its namespace as chat requests name them.
Reading under a session the caller does not have is a 404 (``session_not_found``);
a todo list may be set before the session's first request.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, put
from litestar.di import NamedDependency
from litestar.params import FromPath

from pcp_core.hybrid import TodoItem, render, todo_projection

from .. import headers as pcp
from ..decoding import INT64, decode_stored
from ..errors import ClientError
from ..own_api import SessionCheck, checked_session, json_response, limited_body
from .store import HybridState
from .turn import Hybrid

__all__ = ["HYBRID_ROUTES"]

_BASE = "/sessions/{session_id:str}"  # under /v1/pcp
MAX_ITEMS = 1000


class _Item(msgspec.Struct, forbid_unknown_fields=True):
    # A positive integer: the todo.cursor's targetId names items by it.
    id: Annotated[int, msgspec.Meta(ge=1, le=INT64[1])]  # kept as a 64-bit integer
    title: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
    done: bool = False


class _TodoList(msgspec.Struct, forbid_unknown_fields=True):
    items: Annotated[list[_Item], msgspec.Meta(max_length=MAX_ITEMS)]


_TODO = msgspec.json.Decoder(_TodoList)


@get(f"{_BASE}/context")
async def session_context(
    known_session: NamedDependency[SessionCheck], hybrid: NamedDependency[Hybrid], namespace: NamedDependency[str], session_id: FromPath[str]
) -> Response[bytes]:
    """``GET …/context``: the session's latest Hybrid-mode snapshot."""
    session_id = await known_session(namespace, _checked(hybrid, session_id))
    state = await asyncio.to_thread(hybrid.store.get, namespace, session_id)
    if state is None or state.snapshot is None:
        raise ClientError(
            f"session {session_id!r} has no context yet: it has had no request in Hybrid mode",
            status=404,
            type="not_found_error",
            param="session_id",
            code="context_not_found",
        )
    return Response(render(state.snapshot).encode(), media_type="application/json", headers={pcp.CONTEXT_ROUND: str(state.round)})


@put(f"{_BASE}/todo", status_code=200)
async def set_todo(
    request: Request[Any, Any, Any], hybrid: NamedDependency[Hybrid], namespace: NamedDependency[str], session_id: FromPath[str]
) -> Response[bytes]:
    """``PUT …/todo``: the session's todo list, as the client gives it."""
    session_id = _checked(hybrid, session_id)
    body = await limited_body(request, request.app.state.settings.api_max_body_kb * 2**10, "api_max_body_kb")
    items = tuple(TodoItem(item.id, item.title, item.done) for item in _todo_list(body))

    def step(state: HybridState | None) -> HybridState:
        """The session's state with the new todo list."""
        return msgspec.structs.replace(state or HybridState(), todo=items)

    await asyncio.to_thread(hybrid.store.change, namespace, session_id, step)
    return json_response(_todo(session_id, items))


@get(f"{_BASE}/todo")
async def get_todo(
    known_session: NamedDependency[SessionCheck], hybrid: NamedDependency[Hybrid], namespace: NamedDependency[str], session_id: FromPath[str]
) -> Response[bytes]:
    """``GET …/todo``: the session's todo list and its summary."""
    session_id = await known_session(namespace, _checked(hybrid, session_id))
    state = await asyncio.to_thread(hybrid.store.get, namespace, session_id)
    return json_response(_todo(session_id, state.todo if state is not None else ()))


def _checked(hybrid: Hybrid, session_id: str) -> str:
    """The session's id, once it is one and Hybrid mode is on."""
    session_id = checked_session(session_id)
    if hybrid.default == "off":
        raise ClientError("Hybrid mode is off on this proxy: set PCP_HYBRID to enabled or disabled", status=404, type="not_found_error", code="hybrid_off")
    return session_id


def _todo_list(body: bytes) -> list[_Item]:
    """A todo list's items decoded, or a 400 (an id given twice among them)."""
    items = decode_stored(body, _TODO.decode, "todo list", code="invalid_todo").items
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)
        raise ClientError(f"invalid todo list: the ids {twice} are given more than once", param="items", code="invalid_todo")
    return items


def _todo(session_id: str, items: tuple[TodoItem, ...]) -> dict[str, Any]:
    """The todo list as the API shows it: its items and their summary."""
    projection = todo_projection(items)
    return {
        "object": "pcp.todo",
        "session": session_id,
        "items": msgspec.to_builtins(items),
        "summary": projection.summary,
        "total": projection.total,
        "step": projection.step,
    }


HYBRID_ROUTES = [session_context, set_todo, get_todo]
