"""The proxy's own words, which an answer never carries to the client, whatever the model does.

A model may echo its prompt (a small one often does): the ``<PagedContext>``'s
tags and directives are taken out by the directive parser (``Markup``, the
directives); what is left of the prompt's own words is its instructions — the
registry's sentences, the final round's, the user line — and the
Background_Context's lines, a folded page's time, id and keywords each.
``Scaffolding`` takes those out of a text as it streams: it holds back only a
tail that may still grow into one of them, and drops every one that is whole.
A model that paraphrases them is not caught; one that copies them is. The
document's own names (``VOCABULARY``: ``PagedContext``, ``Linear_Flow``…) are
taken out wherever they stand, as a word in a sentence or a JSON value: a
small model writes them out of context ("The PagedContext is …").
"""

from __future__ import annotations

import re

from .document import FINAL_ROUND_INSTRUCTION, PARTS_INSTRUCTION, SYSTEM_INSTRUCTIONS, USER_LINE

__all__ = ["SENTENCES", "VOCABULARY", "Scaffolding", "without_scaffolding"]

# A clause ends after ".", ";" and a space, or at a line's end; a bullet's "- " goes with it. Shorter
# pieces could be the client's own words: only longer ones are the proxy's. In the document the
# instructions are XML text, so an echo of it has them escaped ("&lt;Content&gt;").
_CLAUSE_END = re.compile(r"(?<=[.;])[ \t]+|\n")
MIN_CHARS = 16


_TAG = re.compile(r"</?[A-Za-z_][^<>]*>")
_DIRECTIVE = re.compile(r"\b(?:Consult|Shelve|Explore)\([^)]*\)")


def _clauses(*texts: str) -> tuple[str, ...]:
    """The lines and clauses of the proxy's own texts that an answer may echo."""
    # A line whole, and as it is once the directive parser has taken the directives and tags it names out of it.
    texts = (*texts, *(_TAG.sub("", text) for text in texts))
    lines = {line.strip() for text in texts for line in (*text.splitlines(), *_DIRECTIVE.sub("", text).splitlines())}
    pieces = lines | {piece.strip() for text in texts for piece in _CLAUSE_END.split(text)}
    pieces |= {piece.removeprefix("- ") for piece in pieces}
    pieces |= {piece.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for piece in pieces}
    return tuple(sorted((piece for piece in pieces if len(piece) >= MIN_CHARS), key=len, reverse=True))


SENTENCES = _clauses(SYSTEM_INSTRUCTIONS, FINAL_ROUND_INSTRUCTION, PARTS_INSTRUCTION, USER_LINE)
# The names of the document's parts that no conversation uses as words (its tags are the directive parser's; a
# plain "Node" or "Query" may be the client's own), and the names a model gives the document when it echoes it.
VOCABULARY = (
    "PagedContext", "Paged_Context", "PageContext", "Linear_Flow", "Background_Context", "Static_Registry",
    "System_Instructions", "Reasoning_Trace", "ST-Node", "CURRENT_TIME", "FINAL_ROUND",
)  # fmt: skip
_NAMES = re.compile("|".join(sorted(map(re.escape, VOCABULARY), key=len, reverse=True)))
_PREFIXES = frozenset(piece[:i] for piece in (*SENTENCES, *VOCABULARY) for i in range(1, len(piece)))
_LONGEST = max(map(len, SENTENCES))
# A Background_Context line (``markup.background_line``): "2026-11-26T21:11 [d02fdaee] keyword, keyword".
_BACKGROUND = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d \[[0-9a-f]{4,16}\][^\n]*")
_BACKGROUND_LINES = re.compile(rf"(?m)^{_BACKGROUND.pattern}\n")
_STAMP = "0000-00-00T00:00 ["


def _could_be_background(line: str) -> bool:
    """Whether ``line``, not yet ended, may still turn out to be a Background_Context line."""
    head = line[: len(_STAMP)]
    if any((want == "0") != char.isdigit() or (want != "0" and char != want) for want, char in zip(_STAMP, head)):
        return False
    return len(line) <= len(_STAMP) or bool(re.match(r"\[[0-9a-f]{0,16}(\][^\n]*)?$", line[len(_STAMP) - 1 :]))


class Scaffolding:
    """Feed a text a chunk at a time; what may reach the client comes back, the proxy's sentences left out."""

    def __init__(self) -> None:
        self.held = ""
        self.line_start = True  # the text released so far ends a line (or none was)

    def feed(self, chunk: str) -> str:
        """Release what of ``chunk`` is not the proxy's own words, holding back what may still become them."""
        # A text that does not open a line starts with a mark, so that no line pattern takes its first line.
        text = ("" if self.line_start else _MID_LINE) + self.held + chunk
        for sentence in SENTENCES:
            if sentence in text:
                text = text.replace(sentence, "")
        text = _BACKGROUND_LINES.sub("", text)
        hold = next((k for k in range(min(len(text), _LONGEST - 1), 0, -1) if text[-k:] in _PREFIXES), 0)
        line = text[text.rfind("\n") + 1 :]
        if line and _could_be_background(line):
            hold = max(hold, len(line))
        text = text.removeprefix(_MID_LINE)
        # A name the cut would split (its tail a prefix of a sentence) is held whole, to be taken out whole.
        cut = len(text) - hold
        cut = next((name.start() for name in _NAMES.finditer(text) if name.start() < cut < name.end()), cut)
        hold = len(text) - cut
        self.held = text[len(text) - hold :] if hold else ""
        released = text[: len(text) - hold]
        if released:
            self.line_start = released.endswith("\n")
        return _NAMES.sub("", released)  # a sentence held may hold a name: it is taken out as the sentence's own

    def flush(self) -> str:
        """The text ended: what was held is text after all, but a whole Background_Context line."""
        held, self.held = self.held, ""
        line = held[held.rfind("\n") + 1 :]
        whole_line = len(line) < len(held) or self.line_start
        return _NAMES.sub("", held[: len(held) - len(line)] if whole_line and _BACKGROUND.fullmatch(line) else held)


_MID_LINE = "\x00"


def without_scaffolding(text: str) -> str:
    """``text`` without the proxy's own words."""
    scaffolding = Scaffolding()
    return scaffolding.feed(text) + scaffolding.flush()
