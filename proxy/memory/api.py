"""The memory API (``/v1/pcp/memory/{scope}/…``): what a caller's memory holds, to read, search, export, import and forget.

Every route is the caller's: its key's namespace prefixes the scope (as for
the chat routes), so one key never reads another's memory. Errors use the
OpenAI envelope. Writes (forget, import, drop) run on the memory's writer
thread, after the write-backs queued before them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Stream

from pcp_core import SESSION_ID, ConsolidatedPage, Conversation, OriginalPage, Page
from pcp_core.hybrid import Block
from pcp_core.memory import decay, memory_intent, ranked
from pcp_core.pages import Origin

from ..errors import ClientError
from ..own_api import json_response
from .scopes import checked_scope
from .service import Memory
from .store import Stored, scope_key

__all__ = ["MEMORY_ROUTES"]

MAX_LIMIT = 200
EXPORT_BATCH = 1000


class CoreLine(msgspec.Struct, frozen=True, tag="Core"):
    """The scope's Hybrid-mode core blocks (``proxy.memory.core``), the export's last line when it has any."""

    blocks: tuple[Block, ...]


_line_decoder = msgspec.json.Decoder(OriginalPage | ConsolidatedPage | CoreLine)


def _scope(memory: Memory | None, namespace: str, name: str) -> tuple[Memory, str]:
    """The memory service and the caller's scope key, once memory is there and the name is a scope's."""
    if memory is None:
        raise ClientError("memory is not available on this proxy", status=404, code="memory_unavailable")
    return memory, scope_key(namespace, checked_scope(name, param="scope"))


def _shown(page: Page, **more: Any) -> dict[str, Any]:
    return {**msgspec.to_builtins(page), **more}


@get("/memory/{name:str}")
async def scope_status(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    memory, key = _scope(memory, namespace, name)
    counts = await asyncio.to_thread(_status, memory, key)
    return json_response({"scope": name, "pages": counts["originals"] + counts["consolidated"], **counts, "pending": memory.pending[key]})


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
    """A page as listed: with what requests did with it, and how far disuse has decayed it (``pcp_core.memory.metabolism``)."""
    idle = max(clock - stored.used, 0)
    decayed = round(decay(idle, memory.memory.metabolism), 4)
    return _shown(stored.page, record=stored.record, recalls=stored.recalls, shown=stored.shown, consulted=stored.consulted, idle=idle, decay=decayed)


def _searched(memory: Memory, key: str, query: str, limit: int, offset: int) -> tuple[list[Page], bool]:
    conversation = Conversation.of([{"role": "user", "content": query}], memory.policy.paging.blocks, memory.count)
    intent = memory_intent(conversation, memory.policy, None, memory.count)
    candidates = memory.broad_match(key, intent, records=True)
    order = [candidates[i].page for i in ranked(intent, candidates, None, memory.memory)]
    return order[offset : offset + limit], len(order) > offset + limit


@get("/memory/{name:str}/pages/{page_id:str}")
async def one_page(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
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
    memory, key = _scope(memory, namespace, name)
    page_id = request.path_params["page_id"]
    if not await asyncio.to_thread(memory.store.pages, key, [page_id]):
        raise ClientError(f"no page {page_id!r} in this scope", status=404, param="page_id", code="page_not_found")
    removed = await asyncio.wrap_future(memory.forget(key, ids=[page_id]))
    return json_response({"deleted": removed})


class _Forget(msgspec.Struct, forbid_unknown_fields=True):
    ids: list[str] = []
    query: str = ""


@post("/memory/{name:str}/forget", status_code=200)
async def forget(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """Remove pages for good: ``{"ids": [...]}`` (each with the pages under it) or ``{"query": "..."}`` (the Originals holding all its words)."""
    memory, key = _scope(memory, namespace, name)
    try:
        asked = msgspec.json.decode(await request.body(), type=_Forget)
    except msgspec.DecodeError as error:
        raise ClientError(f'the body must be {{"ids": [...]}} or {{"query": "..."}}: {error}', param="body") from None
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
    blocks join the scope's (a block of the same id is the import's)."""
    memory, key = _scope(memory, namespace, name)
    pages, core, records = _read_lines(await request.body())
    known = set(
        await asyncio.to_thread(lambda: {p.id for p in memory.store.pages(key, [c for p in pages if isinstance(p, ConsolidatedPage) for c in p.source_ids])})
    )
    given = {p.id for p in pages}
    for n, page in enumerate(pages, 1):
        absent = [c for c in getattr(page, "source_ids", ()) if c not in given and c not in known]
        if absent:
            raise ClientError(f"line {n}: page {page.id} holds {absent[0]!r}, which is neither in the import nor in the scope", param=f"line {n}")
    cores = memory.cores
    kept_core = core if cores is not None else []  # a memory without Hybrid's store keeps none
    if cores is not None and core:  # only once the whole import is known good: a refused one keeps nothing
        await asyncio.to_thread(cores.keep, key, core, ())
    written = await asyncio.wrap_future(memory.run(key, lambda: memory.write_pages(key, pages, owner="import", records=records))) if pages else None
    imported = len(written.added) if written is not None else 0
    return json_response({"imported": imported, "skipped": len(pages) - imported, "core_blocks": len(kept_core)})


class _Record(msgspec.Struct):
    record: bool = False  # a page that added nothing to its scope (export marks it)


def _read_lines(body: bytes) -> tuple[list[Page], list[Block], frozenset[str]]:
    pages: list[Page] = []
    core: list[Block] = []
    records: set[str] = set()
    for n, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = _line_decoder.decode(line)
            record = msgspec.json.decode(line, type=_Record).record
        except msgspec.DecodeError as error:
            raise ClientError(f"line {n} is neither a page nor core blocks: {error}", param=f"line {n}") from None
        if isinstance(item, CoreLine):
            core += item.blocks
            continue
        if not SESSION_ID.match(item.id):
            raise ClientError(f"line {n}: a page id is 1 to 128 letters, digits or . _ : -", param=f"line {n}")
        pages.append(msgspec.structs.replace(item, origin=Origin.STORAGE, draft=False))
        if record:
            records.add(item.id)
    if not pages and not core:
        raise ClientError("the body holds no pages: send JSON lines, one page each, as export writes them", param="body")
    return pages, core, frozenset(records)


@delete("/memory/{name:str}", status_code=200)
async def drop_scope(
    request: Request[Any, Any, Any], memory: NamedDependency[Memory | None], namespace: NamedDependency[str], name: FromPath[str]
) -> Response[bytes]:
    """Everything the scope holds, gone (forgotten turns included)."""
    memory, key = _scope(memory, namespace, name)
    removed = await asyncio.wrap_future(memory.run(key, lambda: memory.drop(key)))
    return json_response({"deleted_pages": removed})


def _number(raw: str, name: str, low: int, high: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ClientError(f"{name} must be an integer, got {raw[:20]!r}", param=name) from None
    if not low <= value <= high:
        raise ClientError(f"{name} must be between {low} and {high}", param=name)
    return value


MEMORY_ROUTES = [scope_status, list_pages, one_page, delete_page, forget, export, import_pages, drop_scope]
