"""The inspector's data, under the proxy's own API: the caller's sessions, one session's pages and traced requests.

* ``GET /v1/pcp/sessions`` — the caller's sessions, latest first;
* ``GET /v1/pcp/sessions/{id}`` — one session: its summary, its page tree,
  the traces of its latest protocol-mode requests (``proxy.protocol.telemetry``),
  and their bill summed beside the same requests' sent untouched (``data.bill_totals``);
* ``GET /v1/pcp/requests/{trace}`` — one request's trace, by its ``x-pcp-trace``.

Everything is the caller's: named under its namespace (a keyed hash of its
key), as chat requests name their sessions, so one key never sees another's.
With ``PCP_API_KEYS`` set a proxy key is needed, as for a chat request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from ..errors import ClientError
from ..own_api import checked_session, json_response, session_not_found
from ..protocol.telemetry import Traces
from ..storage.sessions import SessionStore
from ..tokenizer import Tokenizer
from .data import bill_totals, page_tree, session_summary

__all__ = ["INSPECTOR_API"]

# A listing reads every session of the caller from the disk: bounded, newest kept.
MAX_LISTED = 500


@get("/sessions")  # under /v1/pcp
async def list_sessions(sessions: NamedDependency[SessionStore], traces: NamedDependency[Traces], namespace: NamedDependency[str]) -> Response[bytes]:
    """``GET /v1/pcp/sessions``: the caller's sessions, the latest first."""
    return _json(await asyncio.to_thread(_listed, sessions, traces, namespace))


@get("/sessions/{session_id:str}")
async def show_session(
    sessions: NamedDependency[SessionStore],
    traces: NamedDependency[Traces],
    tokenizer: NamedDependency[Tokenizer],
    namespace: NamedDependency[str],
    session_id: FromPath[str],
) -> Response[bytes]:
    """``GET /v1/pcp/sessions/{session_id}``: one session's page tree and its traced requests."""
    session_id = checked_session(session_id)
    shown = await asyncio.to_thread(_shown, sessions, traces, tokenizer, namespace, session_id)
    if shown is None:
        raise session_not_found(session_id)
    return _json(shown)


@get("/requests/{trace_id:str}")
async def show_request(traces: NamedDependency[Traces], namespace: NamedDependency[str], trace_id: FromPath[str]) -> Response[bytes]:
    """``GET /v1/pcp/requests/{trace_id}``: one traced request."""
    trace = traces.get(namespace, trace_id)
    if trace is None:
        raise ClientError(
            "no traced request with that id for this key (traces are kept in memory, the latest of each session)",
            status=404,
            type="not_found_error",
            code="trace_not_found",
        )
    return _json(trace)


def _listed(store: SessionStore, traces: Traces, namespace: str) -> dict[str, Any]:
    """The caller's stored sessions, summarised, the latest first."""
    store.flush()  # a session saved a moment ago is on its way to the disk
    traced = traces.sessions_of(namespace)
    ids = [sid for owner, sid in store.stored() if owner == namespace]
    found = [store.read(namespace, session_id) for session_id in ids]
    sessions = [session_summary(session, traced.get(session.id, 0)) for session in found if session is not None]
    sessions.sort(key=lambda s: s["last_seen"], reverse=True)
    return {"object": "list", "data": sessions[:MAX_LISTED], "truncated": len(sessions) > MAX_LISTED}


def _shown(store: SessionStore, traces: Traces, tokenizer: Tokenizer, namespace: str, session_id: str) -> dict[str, Any] | None:
    """One session as the inspector shows it, or None if it is not stored."""
    store.flush()
    session = store.read(namespace, session_id)
    if session is None:
        return None
    traced = traces.of_session(namespace, session_id)
    roots, pages = page_tree(session, tokenizer.count)
    return {**session_summary(session, len(traced)), "roots": roots, "pages": pages, "requests": traced, "bill": bill_totals(traced)}


def _json(content: Any) -> Response[bytes]:
    """A JSON response no one caches."""
    return json_response(content, headers={"cache-control": "no-store"})


INSPECTOR_API = [list_sessions, show_session, show_request]
