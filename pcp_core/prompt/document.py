"""The ``<PagedContext>`` document's text (§IX), in the order that changes least from one call to the next.

Providers reuse a prompt's prefix that is byte-identical to a recent prompt's,
so the document is laid out what changes least first (after the client's
system prompt and first message, as it sent them: ``synthesis``):

1. the ``Static_Registry`` (the instructions);
2. the ``Background_Context`` (the roots folded to a line) and the head of the
   ``Linear_Flow``: the overview and the latest closed pages: a follow-up's
   frame (``pcp_core.prompt.frame``), replayed as it was rendered;
3. the rest of the flow: the pages ranked for this request, what its rounds
   brought in;
4. the trace, the Query, the time it is asked at (to the minute), and whether
   this is the final round.

Each piece is written with lxml, so every piece of user text is escaped: no
message can close a tag or forge a Node. One element a line, no indentation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lxml import etree

from ..pages.logical import Page
from ..text.tokens import CountText
from .markup import background_line, newlines, shown_time, xml_safe

__all__ = [
    "FINAL_ROUND_INSTRUCTION",
    "FLOW_CLOSE",
    "FLOW_OPEN",
    "PARTS_INSTRUCTION",
    "PROTOCOL_VERSION",
    "SYSTEM_INSTRUCTIONS",
    "USER_LINE",
    "background",
    "element_text",
    "node_ends",
    "node_places",
    "node_starts",
    "paged_context",
    "registry",
    "tail",
]

PROTOCOL_VERSION = "0.1.0-alpha"

SYSTEM_INSTRUCTIONS = """
You are the assistant of the conversation paged in this document; Linear_Flow holds its pages (Node), each with the time it was said; Background_Context lists folded ones by id.
- A Node is an Original page (verbatim turns) unless type="Consolidated" (a summary of the pages inside it).
- view="Summary": gist; "Detail", or a Node holding <Content>: full text; "Unpacked": the pages inside, nested. A page opened shows again further down, in its new view.
If the visible pages lack what the Query needs, do not guess; reply only with directives, one per line:
Consult("reason", "id") opens a page one level; Shelve("reason", "id") folds it; Explore("reason", "history or id", "keyword, keyword") searches pages.
Otherwise answer the Query as the assistant, in plain text, never mentioning pages, ids or this document.
""".strip()

PARTS_INSTRUCTION = "A [image_url …], [input_audio …] or [file …] in a page stands for what that message attached: Consult the page to be shown it."
FINAL_ROUND_INSTRUCTION = "This is the final round: answer the Query now from what is visible. Directives are not accepted."
USER_LINE = "Respond to the Query of the PagedContext."

FLOW_OPEN = "<Linear_Flow>\n"
FLOW_CLOSE = "</Linear_Flow>\n"
_OPEN = f'<PagedContext version="{PROTOCOL_VERSION}">\n'
_CLOSE = "</PagedContext>"


def element_text(element: etree._Element) -> str:
    """An element of the document on its own lines, as it stands in it."""
    newlines(element)
    element.tail = "\n"
    return etree.tostring(element, encoding="unicode", with_tail=True)


def registry(parts: bool) -> str:
    """The document's opening: the version and the instructions (``parts``: the history attached files). The client's
    head is not in it: it goes before the document, as the client sent it (``synthesis``)."""
    element = etree.Element("Static_Registry")
    etree.SubElement(element, "System_Instructions").text = "\n".join([SYSTEM_INSTRUCTIONS, *([PARTS_INSTRUCTION] if parts else [])])
    return _OPEN + element_text(element)


def paged_context(text: str) -> str:
    """The ``<PagedContext>`` in a worker prompt's user message text: after what leads it (the client's first
    message, which may quote the tags), up to the host's appendix. Inside the document, text is escaped."""
    start, end = text.rfind(_OPEN), text.rfind(_CLOSE)
    return text[start : end + len(_CLOSE)] if 0 <= start < end else ""


def background(folded: Sequence[Page]) -> str:
    """The roots folded to a line each, by id: still a Consult away."""
    if not folded:
        return ""
    element = etree.Element("Background_Context")
    element.text = "\n" + "\n".join(background_line(page) for page in folded) + "\n"
    return element_text(element)


def tail(trace: Sequence[Any], query: str, current_time: str, final: bool) -> str:
    """What is new with every call: the trace, the Query, the time it is asked at, whether it is the final round; and the end."""
    pieces = []
    trace_element = etree.Element("Reasoning_Trace")
    for step in trace:
        attrs = {"action": step.action, "target": xml_safe(step.target), "reason": xml_safe(step.reason)}
        etree.SubElement(trace_element, "Step", attrs, **({"result": step.result} if step.result else {}))
    pieces.append(element_text(trace_element))
    query_element = etree.Element("Query")
    query_element.text = xml_safe(query)
    pieces.append(element_text(query_element))
    pieces.append(element_text(etree.Element("ST-Node", id="CURRENT_TIME", value=shown_time(current_time))))
    if final:
        pieces.append(element_text(etree.Element("ST-Node", id="FINAL_ROUND", value="true")))
    return "".join(pieces) + _CLOSE


# -- where the flow's top-level nodes are in a document ---------------------------------------


def node_starts(document: str, lines: Sequence[int], count: CountText) -> list[int]:
    """The token at which each top-level node starts in ``document`` (``lines``: the characters, ``_lines``), counted a line at a time."""
    starts, at, tokens = [], 0, 0
    for line in lines:
        tokens += count(document[at:line])
        starts.append(tokens)
        at = line
    return starts


def node_ends(document: str, lines: Sequence[int]) -> list[int]:
    """The character at which each top-level node ends in ``document`` (``lines``: where each starts): where the next one, or the flow's end tag, starts."""
    return [*lines[1:], document.find("</Linear_Flow>", lines[-1])] if lines else []


def node_places(document: str, layout: Sequence[str], start: int = 0) -> list[int]:
    """The character at which each top-level node of ``layout`` starts in ``document`` (from ``start``: after a frame, which may show a page again)."""
    lines, at = [], max(start - 1, 0)
    for page_id in layout:
        at = document.find(f'\n<Node id="{page_id}"', at) + 1
        lines.append(at)
    return lines
