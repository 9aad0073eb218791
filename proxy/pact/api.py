"""The proxy's own API for PACT components (``pcp_core.pact.tree``), under ``/v1/pcp/sessions/{id}``.

* ``POST …/components`` attaches one (``{"at": "d0,1,0", "content": …, "ttl", "cadence", "key", "tags"}``)
  and answers its node; a key already in the session is replaced;
* ``GET …/components?select=d1-3,1,*`` lists them (all without ``select``), in render order;
* ``DELETE …/components/{id or key}`` detaches one;
* ``GET …/tree`` is the whole tree, a PACT v0.1 snapshot.

Reading or deleting under a session the caller does not have is a 404
(``session_not_found``); attaching a component before the session's first
request is how a session starts with components.

Sessions are the caller's: named under its namespace (a hash of its key),
as chat requests name them, so one key never reads or changes another's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath

from pcp_core import ComponentSpec, PactError, Tree, insert, node, parse_selector, select, snapshot
from pcp_core import delete as detach

from ..decoding import decode_stored
from ..errors import ClientError
from ..own_api import SessionCheck, checked_session, json_response, limited_body, too_large
from ..settings import Settings
from .components import Components

__all__ = ["COMPONENT_ROUTES"]

_SPEC = msgspec.json.Decoder(ComponentSpec)
_BASE = "/sessions/{session_id:str}"  # under /v1/pcp


@post(f"{_BASE}/components", status_code=201)
async def add_component(
    request: Request[Any, Any, Any], components: NamedDependency[Components], namespace: NamedDependency[str], session_id: FromPath[str]
) -> Response[bytes]:
    """``POST …/components``: a component added to (or replacing one of) the session's."""
    session = checked_session(session_id)
    settings: Settings = request.app.state.settings
    spec = _spec(await limited_body(request, settings.api_max_body_kb * 2**10, "api_max_body_kb"))
    components.check_size(spec)
    added: list[Any] = []

    def step(tree: Tree) -> Tree:
        """The tree with the component in it, within the session's bound."""
        held = sum(1 for c in tree.components if spec.key is None or c.key != spec.key)
        if held >= components.most:
            raise too_large("this session's components", f"{held}", f"{components.most}", "components_per_session")
        try:
            tree, component = insert(tree, spec, time.time_ns())
        except PactError as error:
            raise ClientError(str(error), param="at", code="invalid_component") from None
        added.append(component)
        return tree

    tree = await asyncio.to_thread(components.store.change, namespace, session, step)
    return json_response(node(added[0], tree), status=201)


@get(f"{_BASE}/components")
async def list_components(
    request: Request[Any, Any, Any],
    known_session: NamedDependency[SessionCheck],
    components: NamedDependency[Components],
    namespace: NamedDependency[str],
    session_id: FromPath[str],
) -> Response[bytes]:
    """``GET …/components``: the session's components, those ``select`` picks if given."""
    text = request.query_params.get("select")
    checked_session(session_id)  # what is wrong with the request before whether the session exists
    try:
        selector = parse_selector(text) if text is not None else None
    except PactError as error:
        raise ClientError(f"select {error}", param="select", code="invalid_selector") from None
    session = await known_session(namespace, session_id)
    tree = await _tree(components, namespace, session)
    return json_response({"object": "list", "session": session, "data": [node(c, tree) for c in select(tree, selector)]})


@delete(f"{_BASE}/components/{{ref:str}}", status_code=200)
async def delete_component(
    known_session: NamedDependency[SessionCheck],
    components: NamedDependency[Components],
    namespace: NamedDependency[str],
    session_id: FromPath[str],
    ref: FromPath[str],
) -> Response[bytes]:
    """``DELETE …/components/{ref}``: a component, by id or key, out of the session's."""
    session = await known_session(namespace, session_id)
    removed: list[Any] = []

    def step(tree: Tree) -> Tree:
        """The tree without the component, or a 404 if it has none such."""
        tree, component = detach(tree, ref)
        if component is None:
            raise ClientError(f"session {session!r} has no component whose id or key is {ref!r}", status=404, param="ref", code="component_not_found")
        removed.append(node(component, tree))
        return tree

    await asyncio.to_thread(components.store.change, namespace, session, step)
    return json_response({**removed[0], "deleted": True})


@get(f"{_BASE}/tree")
async def component_tree(
    known_session: NamedDependency[SessionCheck], components: NamedDependency[Components], namespace: NamedDependency[str], session_id: FromPath[str]
) -> Response[bytes]:
    """``GET …/tree``: the session's component tree."""
    session = await known_session(namespace, session_id)
    return json_response(snapshot(await _tree(components, namespace, session), session))


async def _tree(components: NamedDependency[Components], namespace: NamedDependency[str], session_id: FromPath[str]) -> Tree:
    """The session's tree (an empty one for a session of the caller's without components)."""
    return await asyncio.to_thread(components.store.get, namespace, session_id) or Tree()


def _spec(body: bytes) -> ComponentSpec:
    """A component's spec decoded, or a 400 naming the field."""
    try:
        return decode_stored(body, _SPEC.decode, "component", code="invalid_component")
    except ClientError as error:
        # Coordinates are checked once the fields are read, and their message (which quotes them) names no field.
        if error.body.code == "invalid_component" and error.body.param is None and error.body.message.startswith("invalid component: '"):
            error.body.param = "at"
        raise


COMPONENT_ROUTES = [add_component, list_components, delete_component, component_tree]
