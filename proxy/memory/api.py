"""The memory API (``/v1/pcp/memory/{scope}/…``): what a caller's memory holds, to read, search, export, import and forget.

Every route is the caller's: its key's namespace prefixes the scope (as for
the chat routes), so one key never reads another's memory. Errors use the
OpenAI envelope. Writes (forget, import, drop) run on the memory's writer
thread, after the write-backs queued before them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Stream

from pcp_core import ConsolidatedPage, Conversation, Page
from pcp_core.memory import decay, memory_intent, ranked

from ..decoding import decode_stored
from ..errors import ClientError
from ..own_api import json_response, limited_body, too_large
from ..settings import Settings
from .imports import IMPORT_BATCH, CoreLine, read_import
from .scopes import checked_scope
from .service import Memory
from .store import Stored, scope_key

__all__ = ["MEMORY_ROUTES"]

MAX_LIMIT = 200
MAX_SCOPES = 500  # a listing counts each scope it shows
EXPORT_BATCH = 1000


def _settings(request: Request[Any, Any, Any]) -> Settings:
    """The settings the app was started with."""
    settings: Settings = request.app.state.settings
    return settings


def _scope(memory: Memory | None, namespace: str, name: str) -> tuple[Memory, str]:
    """The memory service and the caller's scope key, once memory is there and the name is a scope's."""
    if memory is None:
        raise ClientError("memory is not available on this proxy", status=404, code="memory_unavailable")
    return memory, scope_key(namespace, checked_scope(name, param="scope"))


def _shown(page: Page, **more: Any) -> dict[str, Any]:
    """A page as the API shows it, with ``more`` fields beside its own."""
    return {**msgspec.to_builtins(page), **more}


@get("/memory")
async def list_scopes(memory: NamedDependency[Memory | None], namespace: NamedDependency[str]) -> Response[bytes]:
    """``GET /v1/pcp/memory``: the caller's scopes (those holding a page or a forgotten turn), each with its counts."""
    if memory is None:
        raise ClientError("memory is not available on this proxy", status=404, code="memory_unavailable")
    return json_response(await asyncio.to_thread(_scopes, memory, namespace))


def _scopes(memory: Memory, namespace: str) -> dict[str, Any]:
    """The caller's scopes in name order, at most ``MAX_SCOPES`` of them counted."""
    names = memory.store.scopes(namespace)
    listed = []
    for name in names[:MAX_SCOPES]:
        key = scope_key(namespace, name)
        pending = memory.pending[key]
        counts = _status(memory, key)
        listed.append({"scope": name, "pages": counts["originals"] + counts["consolidated"], **counts, "pending": pending})
    return {"object": "list", "data": listed, "truncated": len(names) > MAX_SCOPES}


@get("/memory/{name:str}")
async def scope_status(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """``GET /v1/pcp/memory/{name}``: the scope's counts, and the writes still pending."""
    memory, key = _scope(memory, namespace, name)
    pending = memory.pending[key]  # read before the counts: a 0 here vouches for every write the counts then show
    counts = await asyncio.to_thread(_status, memory, key)
    return json_response({"scope": name, "pages": counts["originals"] + counts["consolidated"], **counts, "pending": pending})


def _status(memory: Memory, key: str) -> dict[str, int]:
    """The store's counts; ``faded``: pages no Consult opened over the last half-life of the scope's requests; ``indexing``."""
    half_life = memory.memory.metabolism.half_life_requests
    return {**memory.store.counts(key, memory.store.clock(key) - half_life + 1), "indexing": memory.indexing(key)}


@get("/memory/{name:str}/pages")
async def list_pages(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """Pages in the order they were written (``cursor``: the last row seen), or the best for ``query`` (``cursor``: an offset)."""
    memory, key = _scope(memory, namespace, name)
    query = request.query_params.get("query", "")
    limit = _number(request.query_params.get("limit", "20"), "limit", 1, MAX_LIMIT)
    cursor = _number(request.query_params.get("cursor", "0"), "cursor", 0, 2**62)
    if query:
        pages, more = await asyncio.to_thread(_searched, memory, key, query, limit, cursor)
        return json_response({"data": [_shown(p) for p in pages], "next_cursor": str(cursor + limit) if more else None})
    stored = await asyncio.to_thread(memory.store.listing, key, cursor, limit + 1)
    shown = stored[:limit]
    more = len(stored) > limit
    clock = await asyncio.to_thread(memory.store.clock, key)
    return json_response({"data": [_used(memory, s, clock) for s in shown], "next_cursor": str(shown[-1].row) if more else None})


def _used(memory: Memory, stored: Stored, clock: int) -> dict[str, Any]:
    """A page as listed: with what requests did with it, and how far disuse has decayed it (``pcp_core.memory.fading``)."""
    idle = max(clock - stored.used, 0)
    decayed = round(decay(idle, memory.memory.metabolism), 4)
    return _shown(stored.page, record=stored.record, recalls=stored.recalls, shown=stored.shown, consulted=stored.consulted, idle=idle, decay=decayed)


def _searched(memory: Memory, key: str, query: str, limit: int, offset: int) -> tuple[list[Page], bool]:
    """A page of ``query``'s search results, as the Memory Router ranks them, and whether more follow."""
    conversation = Conversation.of([{"role": "user", "content": query}], memory.policy.paging.blocks, memory.count)
    intent = memory_intent(conversation, memory.policy, None, memory.count)
    candidates = memory.broad_match(key, intent, records=True)
    order = [candidates[i].page for i in ranked(intent, candidates, None, memory.memory)]
    return order[offset : offset + limit], len(order) > offset + limit


@get("/memory/{name:str}/pages/{page_id:str}")
async def one_page(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """``GET …/pages/{page_id}``: one page of the scope, with its parents."""
    memory, key = _scope(memory, namespace, name)
    page_id = request.path_params["page_id"]
    found = await asyncio.to_thread(memory.store.pages, key, [page_id])
    if not found:
        raise ClientError(f"no page {page_id!r} in this scope", status=404, param="page_id", code="page_not_found")
    parents = await asyncio.to_thread(memory.store.parents, key, [page_id])
    return json_response(_shown(found[0], parents=parents.get(page_id, [])))


@delete("/memory/{name:str}/pages/{page_id:str}", status_code=200)
async def delete_page(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """``DELETE …/pages/{page_id}``: forget one page of the scope."""
    memory, key = _scope(memory, namespace, name)
    page_id = request.path_params["page_id"]
    if not await asyncio.to_thread(memory.store.pages, key, [page_id]):
        raise ClientError(f"no page {page_id!r} in this scope", status=404, param="page_id", code="page_not_found")
    removed = await asyncio.wrap_future(memory.forget(key, ids=[page_id]))
    return json_response({"deleted": removed})


class _Forget(msgspec.Struct, forbid_unknown_fields=True):
    ids: list[str] = []
    query: str = ""


_FORGET = msgspec.json.Decoder(_Forget)


@post("/memory/{name:str}/forget", status_code=200)
async def forget(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """Remove pages for good: ``{"ids": [...]}`` (each with the pages under it) or ``{"query": "..."}`` (the Originals holding all its words)."""
    memory, key = _scope(memory, namespace, name)
    body = await limited_body(request, _settings(request).api_max_body_kb * 2**10, "api_max_body_kb")
    asked = decode_stored(body, _FORGET.decode, 'forget request (give {"ids": [...]} or {"query": "..."})', code="invalid_forget")
    if bool(asked.ids) == bool(asked.query.strip()):
        raise ClientError('give one of "ids" (a list of page ids) or "query" (words the pages hold)', param="body")
    removed = await asyncio.wrap_future(memory.forget(key, ids=asked.ids, query=asked.query))
    return json_response({"forgotten": removed})


@get("/memory/{name:str}/export")
async def export(request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]) -> Stream:
    """Every page as one JSON line, in the order written: a container after the pages it holds (``source_ids``);
    then the scope's core blocks, if it has any (``{"type": "Core", "blocks": [...]}``)."""
    memory, key = _scope(memory, namespace, name)

    async def lines() -> AsyncIterator[bytes]:
        """The export's lines: every page in batches, then the scope's core blocks if it has any."""
        after = 0
        while batch := await asyncio.to_thread(memory.store.listing, key, after, EXPORT_BATCH):
            yield b"".join(_line(s) for s in batch)
            after = batch[-1].row
        blocks = await asyncio.to_thread(memory.cores.recall, key) if memory.cores is not None else ()
        if blocks:
            yield msgspec.json.encode(CoreLine(tuple(blocks))) + b"\n"

    return Stream(lines(), media_type="application/x-ndjson")


def _line(stored: Stored) -> bytes:
    """A page's export line: its own fields, and ``"record": true`` for a record (import keeps it one)."""
    return msgspec.json.encode({**msgspec.to_builtins(stored.page), "record": True} if stored.record else stored.page) + b"\n"


@post("/memory/{name:str}/import", status_code=200)
async def import_pages(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """Pages as ``export`` writes them (JSON lines); those the scope holds already are skipped. Core
    blocks join the scope's (a block of the same id is the import's).

    Everything is checked before anything is kept; the pages are then written
    in batches (``IMPORT_BATCH``), each its own job on the memory's writer, so
    other callers' writes go on between them. A failure midway keeps the
    batches before it (the answer is an error: sending the import again skips them).
    """
    memory, key = _scope(memory, namespace, name)
    settings = _settings(request)
    body = await limited_body(request, settings.memory_import_max_mb * 2**20, "memory_import_max_mb", "the import")
    pages, core, records = await asyncio.to_thread(read_import, body, settings)
    new = await asyncio.to_thread(_checked_tree, memory, key, pages)
    if new:
        held = await asyncio.to_thread(memory.store.counts, key)
        total = held["originals"] + held["consolidated"] + len(new)
        if total > settings.memory_scope_max_pages:
            raise too_large("the scope with this import", f"{total} pages", f"{settings.memory_scope_max_pages} pages", "memory_scope_max_pages")
    cores = memory.cores
    kept_core = core if cores is not None else []  # a memory without Hybrid's store keeps none
    if cores is not None and core:  # only once the whole import is known good: a refused one keeps nothing
        await asyncio.to_thread(cores.keep, key, core, ())
    imported = 0
    fresh = [page for page in pages if page.id in new]
    for start in range(0, len(fresh), IMPORT_BATCH):
        batch = fresh[start : start + IMPORT_BATCH]
        vectors = await asyncio.to_thread(memory.page_vectors, key, batch, records)  # encoded here: the shared writer only writes
        written = await asyncio.wrap_future(memory.run(key, functools.partial(memory.write_pages, key, batch, "import", vectors, records)))
        imported += len(written.added)
    return json_response({"imported": imported, "skipped": len(pages) - imported, "core_blocks": len(kept_core)})


def _checked_tree(memory: Memory, key: str, pages: list[Page]) -> set[str]:
    """The ids of the pages the scope does not hold yet, once every container's children are in the import or the scope."""
    given = {p.id for p in pages}
    children = [c for p in pages if isinstance(p, ConsolidatedPage) for c in p.source_ids if c not in given]
    known = {p.id for p in memory.store.pages(key, children)} if children else set()
    for n, page in enumerate(pages, 1):
        absent = [c for c in getattr(page, "source_ids", ()) if c not in given and c not in known]
        if absent:
            raise ClientError(f"page {n} ({page.id}) holds {absent[0]!r}, which is neither in the import nor in the scope", param=f"page {n}")
    return memory.store.missing(key, list(given))


@delete("/memory/{name:str}", status_code=200)
async def drop_scope(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """Everything the scope holds, gone (forgotten turns included)."""
    memory, key = _scope(memory, namespace, name)
    removed = await asyncio.wrap_future(memory.run(key, lambda: memory.drop(key)))
    return json_response({"deleted_pages": removed})


def _number(raw: str, name: str, low: int, high: int) -> int:
    """``raw`` as an integer within ``low``–``high``, or a 400 naming the parameter."""
    try:
        value = int(raw)
    except ValueError:
        raise ClientError(f"{name} must be an integer, got {raw[:20]!r}", param=name) from None
    if not low <= value <= high:
        raise ClientError(f"{name} must be between {low} and {high}", param=name)
    return value


MEMORY_ROUTES = [list_scopes, scope_status, list_pages, one_page, delete_page, forget, export, import_pages, drop_scope]
