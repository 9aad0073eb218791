"""A memory import read and checked whole before anything of it is kept: its lines, its pages, its core blocks.

Every limit is a setting (``memory_import_max_pages``, ``memory_page_max_kb``,
``hybrid_block_max_kb``); past one, a 413 that names it. A line that is not a
page nor core blocks, or holds a number no store keeps, is a 400 that names
the line. Core blocks are held to the rules a round holds the model's to
(``pcp_core.hybrid.block_problems``), under the proxy's Hybrid limits.
"""

from __future__ import annotations

import msgspec

from pcp_core import SESSION_ID, ConsolidatedPage, OriginalPage, Page
from pcp_core.hybrid import Block, LimitsPolicy, block_problems
from pcp_core.hybrid.snapshot import render_block
from pcp_core.pages.logical import Origin

from ..decoding import decode_stored
from ..errors import ClientError
from ..own_api import too_large
from ..settings import Settings

__all__ = ["IMPORT_BATCH", "CoreLine", "read_import"]

# Pages written by one job on the memory's writer: another caller's write waits for one batch at most, not a whole import.
IMPORT_BATCH = 128


class CoreLine(msgspec.Struct, frozen=True, tag="Core"):
    """The scope's Hybrid-mode core blocks (``proxy.memory.scope_cores``), the export's last line when it has any."""

    blocks: tuple[Block, ...]


_LINE = msgspec.json.Decoder(OriginalPage | ConsolidatedPage | CoreLine)


class _Record(msgspec.Struct):
    record: bool = False  # a page that added nothing to its scope (export marks it)


_RECORD = msgspec.json.Decoder(_Record)


def read_import(body: bytes, settings: Settings) -> tuple[list[Page], list[Block], frozenset[str]]:
    """The pages, core blocks and records (the pages export marked ``"record": true``) of an import's JSON lines, each
    checked; a 400 or 413 for the first that is not right."""
    pages: list[Page] = []
    core: list[Block] = []
    records: set[str] = set()
    page_limit = settings.memory_page_max_kb * 2**10
    limits = LimitsPolicy(max_decay=settings.hybrid_max_decay, min_confidence=settings.hybrid_min_confidence)
    for n, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        if len(line) > page_limit and not line.lstrip().startswith(b'{"type":"Core"'):
            raise too_large(f"line {n} (a page)", f"{len(line)} bytes", f"{page_limit} bytes", "memory_page_max_kb")
        item = _line(line, n)
        if isinstance(item, CoreLine):
            core += _checked_blocks(item.blocks, n, limits, settings.hybrid_block_max_kb * 2**10)
            if len(core) > limits.max_blocks:
                raise ClientError(
                    f"the import holds over {limits.max_blocks} core blocks, the most a scope's core holds",
                    status=413,
                    param=f"line {n}",
                    code="limit_exceeded",
                )
            continue
        if not SESSION_ID.fullmatch(item.id):
            raise ClientError(f"line {n}: a page id is 1 to 128 letters, digits or . _ : -", param=f"line {n}")
        pages.append(msgspec.structs.replace(item, origin=Origin.STORAGE, draft=False))
        if b'"record"' in line and _RECORD.decode(line).record:  # read again only where export may have marked it
            records.add(item.id)
        if len(pages) > settings.memory_import_max_pages:
            raise too_large(
                "the import", f"over {settings.memory_import_max_pages} pages", f"{settings.memory_import_max_pages} pages", "memory_import_max_pages"
            )
    if not pages and not core:
        raise ClientError("the body holds no pages: send JSON lines, one page each, as export writes them", param="body")
    return pages, core, frozenset(records)


def _line(line: bytes, n: int) -> OriginalPage | ConsolidatedPage | CoreLine:
    """One line of an import decoded, or a 400 that names the line."""
    try:
        return decode_stored(line, _LINE.decode, f"page or core blocks on line {n}", code="invalid_import")
    except ClientError as error:
        if not error.body.message.startswith("invalid "):  # not JSON, not UTF-8, too deep: say where
            error.body.message = f"line {n}: {error.body.message}"
        error.body.param = f"line {n}"
        raise


def _checked_blocks(blocks: tuple[Block, ...], n: int, limits: LimitsPolicy, max_bytes: int) -> tuple[Block, ...]:
    """Core blocks as a round would keep them, or the 400 (a rule broken) or 413 (too large) for the first that is not."""
    for i, block in enumerate(blocks):
        size = len(render_block(block).encode(errors="surrogatepass"))
        if size > max_bytes:
            raise too_large(f"line {n}: core block {i} ({block.id[:40]!r})", f"{size} bytes", f"{max_bytes} bytes", "hybrid_block_max_kb")
        problems = block_problems(block, limits)
        if problems:
            raise ClientError(f"line {n}: core block {i} ({block.id[:40]!r}): {'; '.join(problems)}", param=f"line {n}", code="invalid_core_block")
    return blocks
