"""The proxy's own API for PACT components (``pcp_core.pact``), under ``/v1/pcp/sessions/{id}``.

* ``POST …/components`` attaches one (``{"at": "d0,1,0", "content": …, "ttl", "cadence", "key", "tags"}``)
  and answers its node; a key already in the session is replaced;
* ``GET …/components?select=d1-3,1,*`` lists them (all without ``select``), in render order;
* ``DELETE …/components/{id or key}`` detaches one;
* ``GET …/tree`` is the whole tree, a PACT v0.1 snapshot.

Sessions are the caller's: named under its namespace (a hash of its key),
as chat requests name them, so one key never reads or changes another's.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, delete, get, post

from pcp_core import (
    SESSION_ID,
    ComponentSpec,
    PactError,
    Tree,
    insert,
    node,
    parse_selector,
    select,
    snapshot,
)
from pcp_core import delete as detach

from ..apis.chat import error_param
from ..errors import ClientError

if TYPE_CHECKING:
    from ..app import Services

__all__ = ["PCP_ROUTES"]

_SPEC = msgspec.json.Decoder(ComponentSpec)
_BASE = "/v1/pcp/sessions/{session_id:str}"


@post(f"{_BASE}/components", status_code=201)
async def add_component(request: Request[Any, Any, Any]) -> Response[bytes]:
    services, namespace, session_id = _caller(request)
    spec = _spec(await request.body())
    added: list[Any] = []

    def step(tree: Tree) -> Tree:
        try:
            tree, component = insert(tree, spec, time.time_ns())
        except PactError as error:
            raise ClientError(str(error), param="at", code="invalid_component") from None
        added.append(component)
        return tree

    tree = await asyncio.to_thread(services.components.store.change, namespace, session_id, step)
    return _json(node(added[0], tree), status=201)


@get(f"{_BASE}/components")
async def list_components(request: Request[Any, Any, Any]) -> Response[bytes]:
    services, namespace, session_id = _caller(request)
    text = request.query_params.get("select")
    try:
        selector = parse_selector(text) if text is not None else None
    except PactError as error:
        raise ClientError(f"select {error}", param="select", code="invalid_selector") from None
    tree = await _tree(services, namespace, session_id)
    return _json({"object": "list", "session": session_id, "data": [node(c, tree) for c in select(tree, selector)]})


@delete(f"{_BASE}/components/{{ref:str}}", status_code=200)
async def delete_component(request: Request[Any, Any, Any]) -> Response[bytes]:
    services, namespace, session_id = _caller(request)
    ref = request.path_params["ref"]
    removed: list[Any] = []

    def step(tree: Tree) -> Tree:
        tree, component = detach(tree, ref)
        if component is None:
            raise ClientError(f"session {session_id!r} has no component whose id or key is {ref!r}", status=404, param="ref", code="component_not_found")
        removed.append(node(component, tree))
        return tree

    await asyncio.to_thread(services.components.store.change, namespace, session_id, step)
    return _json({**removed[0], "deleted": True})


@get(f"{_BASE}/tree")
async def component_tree(request: Request[Any, Any, Any]) -> Response[bytes]:
    services, namespace, session_id = _caller(request)
    return _json(snapshot(await _tree(services, namespace, session_id), session_id))


def _caller(request: Request[Any, Any, Any]) -> tuple[Services, str, str]:
    """The services, the caller's namespace and the session's id, once the caller's key (if the proxy asks for one) and the id are checked."""
    services: Services = request.app.state.services
    session_id: str = request.path_params["session_id"]
    services.upstream_headers(request.headers)  # checks the proxy's key, as a chat request does
    if not SESSION_ID.match(session_id):
        raise ClientError("a session id is 1 to 128 letters, digits or . _ : -", param="session_id", code="invalid_session")
    return services, services.namespaces.of(request.headers), session_id


async def _tree(services: Services, namespace: str, session_id: str) -> Tree:
    """The session's tree (an empty one for a session without components)."""
    return await asyncio.to_thread(services.components.store.get, namespace, session_id) or Tree()


def _spec(body: bytes) -> ComponentSpec:
    try:
        return _SPEC.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        # Coordinates are checked once the fields are read, and their message (which quotes them) names no field.
        param = error_param(text) or ("at" if text.startswith("'") else None)
        raise ClientError(f"invalid component: {text}", param=param, code="invalid_component") from None
    except msgspec.DecodeError as exc:
        raise ClientError(f"request body is not valid JSON: {exc}") from None


def _json(content: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(content), status_code=status, media_type="application/json")


PCP_ROUTES = [add_component, list_components, delete_component, component_tree]
