"""Physical blocks (§5.0, §VIII) and their Draft pages (§VI.2.2, §VI.5).

A message far larger than a page — a pasted file, a tool's long output — is
not paged as turns of the conversation. It is a File PBlock: the history keeps
the message's start and end with the block's handle between them, and the
block is scanned once, when it is paged, into Draft pages:

* its text makes Original Drafts of about a page each, cut at line ends, so
  every line of the block stays whole in one page;
* its structure makes a Consolidated Draft per section: Markdown headings,
  and a source file's top-level definitions (Python, JavaScript/TypeScript,
  Go, Rust: a function, class, struct, … at the start of a line), outside
  code fences. A section is titled by its heading or its definition's
  signature; the comments and decorators just above a definition go with
  it. A heading that states a date dates its section's pages on the
  Timeline;
* a Consolidated Draft whose id is the handle stands over the whole block, so
  ``Consult(handle)`` zooms into it and ``Explore(handle, keywords)`` searches it.

Drafts are addressed with the history on every request: the Router ranks
them with the history's pages, the best are shown in Detail and the next by
Summary (§VI.2.2, equalized presentation). At the end of each round the drafts
the worker was shown above Summary are solidified into formal pages, which the
session keeps and later requests address in their place (§VI.5); the other
drafts are discarded, and the block still holds them. A Consolidated Draft read
in Detail stays a Consolidated page, where §VI.5 makes it an Original page (a
logical endpoint): a leaf in its place would cut the block's pages below it
off from ``Consult`` and ``Explore``, and a leaf beside it would repeat them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence

import msgspec

from ..text.terms import TermStats, top_keywords
from ..text.timeline import time_in
from ..text.tokens import Checkpoint, CountText, split_words, unchecked
from .index import PageIndex
from .logical import ConsolidatedPage, Origin, OriginalPage, Page, Turn, View, at_depth, short_hash, tree_depths
from .summaries import consolidate, extractive_summary

__all__ = ["BLOCK_KIND", "PBlock", "ScanPolicy", "around_handle", "block_handle", "handle_line", "scan", "solidify"]

BLOCK_KIND = "File"
_HEADING = re.compile(r"#{1,6}[ \t]+(\S.*)")
_FENCE = re.compile(r"\s*(```|~~~)")
# A top-level definition starts at the line's start. Python's ends its line with
# ":" (or opens its parameters); the others open a brace, or their parameters,
# at the line's end — which prose lines starting with "type" or "class" do not.
_DEFINITION = re.compile(
    r"(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(.*|class[ \t]+\w+.*:"
    r"|(?:(?:export|default|pub(?:\([^)]*\))?|async|abstract|unsafe|static)[ \t]+)*"
    r"(?:(?:function\*?|func|fn|class|struct|enum|trait|impl|interface|type|mod)[ \t(]|(?:const|let|var)[ \t]+\w+[ \t]*=).*[{(]"
)
# What stands above a definition and belongs to it: comments, decorators, attributes.
_PREAMBLE = re.compile(r"[ \t]*(?:#|//|/\*|\*|@)|[ \t]*$")
TITLE_CHARS = 80  # of a definition's signature, as its section's title


class ScanPolicy(msgspec.Struct, frozen=True):
    """When a message is a PBlock, and how it is scanned into Draft pages."""

    block_tokens: int = 1500  # a message longer than this is a File PBlock
    page_tokens: int = 120  # most tokens of one Original Draft
    fanout: int = 6  # most pages under one Draft container
    keywords: int = 6
    summary_chars: int = 180
    titles_chars: int = 240  # of section titles in the block's own summary
    lead_chars: int = 100  # of the message's start, and of its end, the history keeps

    def is_block(self, text: str, count: CountText) -> bool:
        """Whether a message of ``text`` is paged apart (a token has at least one character: count only if it may be)."""
        return len(text) > self.block_tokens and count(text) > self.block_tokens


class PBlock(msgspec.Struct, frozen=True, kw_only=True):
    handle: str  # the id of the Draft page over the whole block
    turn: int  # the message's position in the conversation
    tokens: int
    sections: int
    drafts: tuple[Page, ...]  # children before their container; the block's own page (id == handle) last


class _Section(msgspec.Struct, frozen=True):
    title: str  # "" before the first heading
    text: str
    timestamp: str


def scan(turn: Turn, count: CountText, policy: ScanPolicy = ScanPolicy(), checkpoint: Checkpoint = unchecked) -> PBlock:
    """The PBlock of the message ``turn``, with its Draft pages (``checkpoint`` is called between sections)."""
    handle = block_handle(turn)
    sections = _sections(turn.text, turn.timestamp)
    chunked: list[list[str]] = []
    for section in sections:
        checkpoint()
        chunked.append(_chunks(section.text, count, policy.page_tokens))
    stats = TermStats([chunk for chunks in chunked for chunk in chunks])  # the block is its own corpus
    drafts: list[Page] = []

    def contain(children: Sequence[Page], title: str = "") -> ConsolidatedPage:
        """A Draft container over ``children``, titled ``title``."""
        page = consolidate(children, stats, policy.keywords, policy.summary_chars)
        page = msgspec.structs.replace(
            page, id=short_hash("Draft", handle, *page.source_ids), summary=f"{title}: {page.summary}" if title else page.summary, draft=True
        )
        drafts.append(page)
        return page

    tops: list[Page] = []
    for n, (section, chunks) in enumerate(zip(sections, chunked)):
        checkpoint()
        leaves: list[Page] = [_draft(handle, f"{n}.{i}", turn.index, chunk, section.timestamp, stats, policy) for i, chunk in enumerate(chunks)]
        drafts += leaves
        level = _fanned(leaves, policy.fanout, contain)
        tops.append(level[0] if len(level) == 1 else contain(level, section.title))
    tokens = count(turn.text)
    level = _fanned(tops, policy.fanout, contain)
    root = level[0] if len(level) == 1 and isinstance(level[0], ConsolidatedPage) else contain(level)
    assert drafts[-1] is root  # every container comes after its children
    titles = "; ".join(s.title for s in sections if s.title)
    about = f"{BLOCK_KIND} of {tokens:,} tokens" + (f" in {len(sections)} sections: {_clip(titles, policy.titles_chars)}" if titles else "")
    drafts[-1] = msgspec.structs.replace(root, id=handle, summary=f"{about}. {root.summary}")
    depths = tree_depths(drafts)
    return PBlock(handle=handle, turn=turn.index, tokens=tokens, sections=len(sections), drafts=tuple(at_depth(p, depths[p.id]) for p in drafts))


def block_handle(turn: Turn) -> str:
    """The handle of the block ``turn`` would be: the same message at the same place, the same handle."""
    return short_hash("PBlock", str(turn.index), turn.text)


def handle_line(handle: str, tokens: int, text: str, policy: ScanPolicy = ScanPolicy()) -> str:
    """What stands in place of the block ``text``: its start and end, and its handle between them.

    The start and end are the first and last paragraphs when they are short
    (where a question or an instruction around a pasted file usually is), else
    ``lead_chars`` of the text, cut between words.
    """
    n = policy.lead_chars
    first, last = text.split("\n\n", 1)[0].strip(), text.rsplit("\n\n", 1)[-1].strip()
    start = first if len(first) <= 2 * n else text[:n].rsplit(" ", 1)[0]
    end = last if len(last) <= 2 * n else text[-n:].split(" ", 1)[-1]
    return f"{start} … [{BLOCK_KIND} {handle}, {tokens:,} tokens, paged apart: Consult or Explore {handle}] … {end}"


_HANDLE_NOTE = re.compile(rf" … \[{BLOCK_KIND} [0-9a-f]+, [0-9,]+ tokens, paged apart: Consult or Explore [0-9a-f]+\] … ")


def around_handle(text: str) -> tuple[str, str]:
    """``text`` split around the note ``handle_line`` puts in: what it says before the block and after it.

    ("", ``text``) when it holds no block.
    """
    parts = _HANDLE_NOTE.split(text, maxsplit=1)
    return ("", text) if len(parts) == 1 else (parts[0], parts[1])


def solidify(shown: Mapping[str, View], index: PageIndex) -> list[Page]:
    """Draft solidification (§VI.5): the formal pages the drafts ``shown`` above Summary become."""
    return [msgspec.structs.replace(page, draft=False) for page_id, view in shown.items() if view != View.SUMMARY and (page := index.get(page_id)).draft]


def _sections(text: str, timestamp: str) -> list[_Section]:
    """``text`` cut before each Markdown heading and each top-level definition outside a code fence.

    Each part keeps its heading line. Text with two top-level definitions (or
    one and no heading) is source code, where a ``#`` line is a comment, not
    a heading; in other text a line that looks like one is prose. A definition
    takes the comments and decorators right above it along; one that follows
    nothing but such lines joins their section and names it.
    """
    lines_fenced = list(_fenced(text.split("\n")))
    unfenced = [line.rstrip() for line, fenced in lines_fenced if not fenced]
    definitions = sum(1 for line in unfenced if _definition(line))
    code = definitions >= 2 or (definitions == 1 and not any(_HEADING.fullmatch(line) for line in unfenced))
    parts: list[tuple[str, list[str]]] = [("", [])]
    for line, fenced in lines_fenced:
        heading = None if fenced or code else _HEADING.fullmatch(line.rstrip())
        definition = None if fenced or not code else _definition(line)
        title, lines = parts[-1]
        if heading and lines:
            parts.append((heading.group(1).strip(), []))
        elif heading:
            parts[-1] = (heading.group(1).strip(), lines)
        elif definition and any(not _PREAMBLE.match(above) for above in lines):
            lead = _lead(lines)
            parts[-1] = (title, lines[: len(lines) - lead])
            parts.append((definition, lines[len(lines) - lead :]))
        elif definition:
            parts[-1] = (definition, lines)
        parts[-1][1].append(line)
    return [_Section(title, "\n".join(lines), time_in(title) or timestamp) for title, lines in parts]


def _fenced(lines: Sequence[str]) -> Iterator[tuple[str, bool]]:
    """Each line, and whether it is inside a code fence (a fence's own lines are)."""
    fenced = False
    for line in lines:
        if _FENCE.match(line):
            fenced = not fenced
            yield line, True
        else:
            yield line, fenced


def _definition(line: str) -> str | None:
    """The signature ``line`` starts a top-level definition with (its section's title), if it does."""
    line = line.rstrip()
    if not _DEFINITION.fullmatch(line):
        return None
    signature = line.rstrip("{(:").rstrip()
    return signature if len(signature) <= TITLE_CHARS else signature[: TITLE_CHARS - 1] + "…"


def _lead(lines: Sequence[str]) -> int:
    """How many of the last ``lines`` stand right above a definition: comments and decorators, no blank line between."""
    n = 0
    while n < len(lines) and lines[-1 - n].strip() and _PREAMBLE.match(lines[-1 - n]):
        n += 1
    return n


def _chunks(text: str, count: CountText, limit: int) -> list[str]:
    """``text`` in pieces of whole lines of at most ``limit`` tokens; a longer line is cut between words."""
    chunks: list[str] = []
    lines: list[str] = []
    used = 0
    for line in text.split("\n"):
        tokens = count(line) + 1
        if lines and used + tokens > limit:
            chunks.append("\n".join(lines))
            lines, used = [], 0
        if tokens > limit:
            chunks += split_words(line, count, limit)
            continue
        lines.append(line)
        used += tokens
    if lines:
        chunks.append("\n".join(lines))
    return [chunk for chunk in chunks if chunk.strip()]


def _fanned(pages: list[Page], fanout: int, contain: Callable[[Sequence[Page]], ConsolidatedPage]) -> list[Page]:
    """``pages`` contained in consecutive runs, level after level, until at most ``fanout`` remain."""
    while len(pages) > fanout:
        pages = [run[0] if len(run) == 1 else contain(run) for run in (pages[i : i + fanout] for i in range(0, len(pages), fanout))]
    return pages


def _draft(handle: str, place: str, turn: int, text: str, timestamp: str, stats: TermStats, policy: ScanPolicy) -> OriginalPage:
    """A Draft page of a block's section: its text, summary and keywords."""
    weights = stats.weights(text)
    return OriginalPage(
        id=short_hash("Draft", handle, place, text),
        origin=Origin.STORAGE,
        depth=0,
        timestamp=timestamp,
        keywords=top_keywords(weights, policy.keywords),
        summary=extractive_summary(text, weights, policy.summary_chars),
        content=text,
        first_turn=turn,
        last_turn=turn,
        draft=True,
    )


def _clip(text: str, limit: int) -> str:
    """``text`` cut at its last ``; `` before ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 1].rsplit("; ", 1)[0] + "; …"
