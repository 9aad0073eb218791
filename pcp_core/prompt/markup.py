"""The PagedContext's markup: its tags, and how a page is written as a Node (§9.3).

A Detail page's markup is paid on every page the budget shows, so a Node
carries only what the worker needs to read and address it.
"""

from __future__ import annotations

import re
from datetime import datetime, time

from lxml import etree

from ..pages.logical import ConsolidatedPage, Origin, Page, View
from ..text.timeline import moment

__all__ = [
    "TAGS",
    "Unescaping",
    "background_line",
    "newlines",
    "node",
    "node_lines",
    "node_type",
    "node_view",
    "shown_time",
    "unescaped",
    "xml_safe",
]

S, D, U = View.SUMMARY, View.DETAIL, View.UNPACKED

# Every tag the document uses: a worker that echoes one is never heard by the client (``pcp_core.directives``).
TAGS = (
    "PagedContext",
    "Static_Registry",
    "ST-Node",
    "System_Instructions",
    "Head",
    "Query",
    "Reasoning_Trace",
    "Step",
    "Background_Context",
    "Linear_Flow",
    "Node",
    "Content",
    "Summary",
)

# Characters XML 1.0 cannot carry at all; they are dropped, not escaped.
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """``text`` without the characters XML cannot hold."""
    return _INVALID_XML.sub("", text)


# What the document's escaping writes for the user's characters (lxml: ``&<>`` in text, ``"`` too in attributes).
_ENTITIES = {"&lt;": "<", "&gt;": ">", "&amp;": "&", "&quot;": '"', "&apos;": "'"}
_ENTITY = re.compile("&(?:lt|gt|amp|quot|apos);")
_LONGEST_ENTITY = max(map(len, _ENTITIES))


class Unescaping:
    """A worker's reply, fed as it streams, with the document's escaping undone: the user's characters again.

    A model quotes the conversation as it read it, escaped (``&lt;3``); its answer is the user's, who
    never typed the entity. Undone once, as it was done once: text the user wrote as ``&lt;`` was shown
    as ``&amp;lt;`` and comes back as ``&lt;``. It is undone before the reply is read for directives and
    markup, so a tag it forms is the document's markup and is taken out with the rest.
    """

    def __init__(self) -> None:
        self.held = ""

    def feed(self, chunk: str) -> str:
        """Unescape ``chunk``, holding back a trailing ``&`` that may start an entity."""
        text = self.held + chunk
        self.held = ""
        tail = text.rfind("&")
        if tail != -1 and len(text) - tail < _LONGEST_ENTITY and any(entity.startswith(text[tail:]) for entity in _ENTITIES):
            text, self.held = text[:tail], text[tail:]
        return _ENTITY.sub(lambda found: _ENTITIES[found.group()], text)

    def flush(self) -> str:
        """Release what was held back: the text has ended."""
        held, self.held = self.held, ""
        return held


def unescaped(text: str) -> str:
    """A whole reply with the document's escaping undone (``Unescaping``)."""
    return _ENTITY.sub(lambda found: _ENTITIES[found.group()], text)


def node(page: Page, view: View, nested: bool) -> etree._Element:
    """A page's Node with only what the worker needs to read and address it.

    Left out, as carrying nothing (§9.3's own examples leave some out too):
    ``type`` for an Original page, the common case; ``origin`` for a page of
    the History; ``depth``, which the nesting shows; ``view`` on an Original
    page in Detail, which holds its ``<Content>`` and cannot open further, so
    the attribute would decide nothing; index keys on a page in Detail, whose
    words are before the worker. A Detail page's markup is paid on every page
    the budget shows, so each token of it is evidence space.
    """
    container = isinstance(page, ConsolidatedPage)
    attrs = {"id": page.id}
    if container:
        attrs["type"] = "Consolidated"
    if container or view != D:
        attrs["view"] = view.value
    if page.origin != Origin.HISTORY:
        attrs["origin"] = page.origin.value
    if page.keywords and view != D:
        attrs["keywords"] = xml_safe(", ".join(page.keywords))
    if page.timestamp:
        attrs["timestamp"] = shown_time(page.timestamp)
    element = etree.Element("Node", attrs)
    if view == D:
        etree.SubElement(element, "Content").text = xml_safe(page.content or page.summary)
    elif view == S and not nested:
        # Nested Summary nodes are addressed by their keywords alone (§9.3, example 5).
        etree.SubElement(element, "Summary").text = xml_safe(page.summary)
    return element


def node_type(node: etree._Element) -> str:
    """The type of a Node of the document, as the worker reads it: Original unless it says otherwise."""
    return node.get("type", "Original")


def node_view(node: etree._Element) -> str:
    """The view of a Node of the document, as the worker reads it: a Node without one is an Original in Detail."""
    return node.get("view", View.DETAIL.value)


def shown_time(timestamp: str) -> str:
    """A timestamp to the minute, or to the day when it states no time of day: seconds tell the worker nothing.

    Its own offset, if it has one, is kept: the worker reads times as they were written.
    A message's own timestamp in another form is shown in ISO 8601, in UTC.
    """
    when: datetime | None
    try:
        when = datetime.fromisoformat(timestamp)
    except ValueError:
        when = moment(timestamp)
        if when is None:
            return xml_safe(timestamp)
    if when.time() == time() and when.tzinfo is None:
        return when.date().isoformat()
    return when.isoformat(timespec="minutes")


def node_lines(page: Page, view: View, nested: bool = False) -> str:
    """The lines a node adds to the document, as the document lays them out, those of its children aside.

    Every line opens with a tag. A tokenizer that never joins a line break
    to the ``<`` after it (tiktoken's do not) counts a document as the sum of
    its lines: then this is the node's exact cost, and its lines are the
    very texts the document's count looks up.
    """
    element = node(page, view, nested)
    if view == U:
        element.text = "\n"  # its children's lines go between its tags
    newlines(element)
    element.tail = "\n"
    return etree.tostring(element, encoding="unicode", with_tail=True)


def background_line(page: Page) -> str:
    """A root's line in Background_Context: its time, its id, its keywords."""
    keywords = ", ".join(page.keywords[:5])
    return xml_safe(f"{shown_time(page.timestamp)} [{page.id}] {keywords}")


def newlines(element: etree._Element) -> None:
    """One element per line, no indentation: readable, and cheaper than pretty printing."""
    children = list(element)
    if children and element.tag != "Content":
        element.text = (element.text or "").rstrip() + "\n" if element.text and element.text.strip() else "\n"
        for child in children:
            child.tail = "\n"
            newlines(child)
        if element.tag == "Node" and children[-1].tag in ("Content", "Summary"):
            children[-1].tail = ""  # "…</Content></Node>": a node closes on the last line of its text
