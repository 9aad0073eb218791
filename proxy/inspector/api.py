"""The inspector's data, under the proxy's own API: the caller's sessions, one session's pages and traced requests.

* ``GET /v1/pcp/sessions`` — the caller's sessions, latest first;
* ``GET /v1/pcp/sessions/{id}`` — one session: its summary, its page tree,
  and the traces of its latest protocol-mode requests (``proxy.telemetry``);
* ``GET /v1/pcp/requests/{trace}`` — one request's trace, by its ``x-pcp-trace``.

Everything is the caller's: named under its namespace (a keyed hash of its
key), as chat requests name their sessions, so one key never sees another's.
With ``PCP_API_KEYS`` set a proxy key is needed, as for a chat request.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response, get

from pcp_core import SESSION_ID

from ..errors import ClientError
from .data import page_tree, session_summary

if TYPE_CHECKING:
    from ..app import Services

__all__ = ["INSPECTOR_API"]

# A listing reads every session of the caller from the disk: bounded, newest kept.
MAX_LISTED = 500


@get("/v1/pcp/sessions")
async def list_sessions(request: Request[Any, Any, Any]) -> Response[bytes]:
    services, namespace = _caller(request)
    return _json(await asyncio.to_thread(_listed, services, namespace))


@get("/v1/pcp/sessions/{session_id:str}")
async def show_session(request: Request[Any, Any, Any]) -> Response[bytes]:
    services, namespace = _caller(request)
    session_id: str = request.path_params["session_id"]
    if not SESSION_ID.match(session_id):
        raise ClientError("a session id is 1 to 128 letters, digits or . _ : -", param="session_id", code="invalid_session")
    shown = await asyncio.to_thread(_shown, services, namespace, session_id)
    if shown is None:
        raise ClientError(f"no session {session_id!r} for this key", status=404, type="not_found_error", code="session_not_found")
    return _json(shown)


@get("/v1/pcp/requests/{trace_id:str}")
async def show_request(request: Request[Any, Any, Any]) -> Response[bytes]:
    services, namespace = _caller(request)
    trace = services.traces.get(namespace, request.path_params["trace_id"])
    if trace is None:
        raise ClientError("no traced request with that id for this key (traces are kept in memory, the latest of each session)", status=404, type="not_found_error", code="trace_not_found")
    return _json(trace)


def _caller(request: Request[Any, Any, Any]) -> tuple[Services, str]:
    services: Services = request.app.state.services
    services.upstream_headers(request.headers)  # checks the proxy's key, as a chat request does
    return services, services.namespaces.of(request.headers)


def _listed(services: Services, namespace: str) -> dict[str, Any]:
    store = services.sessions
    store.flush()  # a session saved a moment ago is on its way to the disk
    traced = services.traces.sessions_of(namespace)
    ids = [sid for owner, sid in store.stored() if owner == namespace]
    found = [store.read(namespace, session_id) for session_id in ids]
    sessions = [session_summary(session, traced.get(session.id, 0)) for session in found if session is not None]
    sessions.sort(key=lambda s: s["last_seen"], reverse=True)
    return {"object": "list", "data": sessions[:MAX_LISTED], "truncated": len(sessions) > MAX_LISTED}


def _shown(services: Services, namespace: str, session_id: str) -> dict[str, Any] | None:
    services.sessions.flush()
    session = services.sessions.read(namespace, session_id)
    if session is None:
        return None
    traces = services.traces.of_session(namespace, session_id)
    roots, pages = page_tree(session, services.tokenizer.count)
    return {**session_summary(session, len(traces)), "roots": roots, "pages": pages, "requests": traces}


def _json(content: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(content), media_type="application/json", headers={"cache-control": "no-store"})


INSPECTOR_API = [list_sessions, show_session, show_request]
