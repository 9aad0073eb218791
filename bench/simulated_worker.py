"""A simulated PCP worker: a deterministic, oracle-free stand-in for the model.

It plays the upstream in a ``proxy.testing.FakeUpstream`` and reads nothing but
the ``<PagedContext>`` the proxy sent (spec §9.3). Its policy:

* a call whose ``x-pcp-role`` is not ``worker`` (consolidator, router, …) is
  answered ``"ok"``;
* in the final round (``<ST-Node id="FINAL_ROUND" value="true"/>``) it answers;
* otherwise it Consults the zoomable node whose summary text (for a
  Consolidated node at Detail, its ``<Content>``, which is that text in full)
  and ``keywords`` share the most distinct words with the Query (ties: more
  matching words, then document order). A node is zoomable when it is at
  ``view="Summary"``, or is a Consolidated node at ``view="Detail"``, and it has
  not already been Consulted as often as that view implies (a page the proxy
  could not raise stays where it was, so it is not asked for again and again);
* when no zoomable node shares a word with the Query, it answers ``ANSWER``.

``simulated_worker`` looks only at the ``<Node>`` elements of the
``<Linear_Flow>``. ``background_worker`` also considers the roots folded into
``<Background_Context>`` (one line each: ``timestamp [id] keywords``), which
the proxy lets the worker Consult as well.

Both are stateless: every decision is a function of the prompt alone.

    with FakeUpstream(default=simulated_worker) as fake:
        ...
    prompts = [worker_document(r) for r in fake.chat_requests("worker")]
    content_texts(prompts[0]), st_nodes(prompts[0])
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from lxml import etree

from pcp_core.prompt.markup import node_type, node_view
from proxy.testing.apis import answer, api_of, worker_document
from proxy.testing.upstream import Recorded, Reply

__all__ = [
    "ANSWER",
    "Candidate",
    "ParsedPrompt",
    "background_worker",
    "choose_consult",
    "content_texts",
    "parse_prompt",
    "simulated_worker",
    "st_nodes",
    "terms",
    "worker_document",
    "worker_reply",
]

ANSWER = "ANSWER"
CONSULT_REASON = "overlaps the question"
FOLDED = "Folded"  # the view of a root listed in <Background_Context>

STOP_WORDS = frozenset(
    """a an the and or but if of to in on at by for with from as about into over after before
    is are was were be been being am do does did done has have had having will would can could
    should shall may might must i me my we our you your he him his she her it its they them their
    what which who whom whose when where why how that this these those there here not no yes so
    than then too very just also any some all each both more most other such only own same
    s t don up out""".split()
)
_WORD = re.compile(r"[a-z0-9]+")
_BACKGROUND_LINE = re.compile(r"^\S*\s*\[([^\]\s]+)\]\s*(.*)$")


def terms(text: str) -> list[str]:
    """Lowercased word tokens of ``text``, stop words removed (repeats kept)."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


# -- reading a worker prompt ---------------------------------------------------------


def _root(document: str | etree._Element) -> etree._Element:
    if isinstance(document, str):
        return etree.fromstring(document.encode())
    return document


def content_texts(document: str | etree._Element) -> list[str]:
    """The text of every ``<Content>`` element, unescaped, in document order."""
    return ["".join(element.itertext()) for element in _root(document).iter("Content")]


def st_nodes(document: str | etree._Element) -> dict[str, str]:
    """``{id: value}`` of the ``<ST-Node>`` elements of the ``<Static_Registry>``."""
    return {node.get("id", ""): node.get("value", "") for node in _root(document).iter("ST-Node")}


@dataclass(frozen=True)
class Candidate:
    id: str
    type: str  # Original | Consolidated ("" for a folded root: the line does not say)
    view: str  # Summary | Detail | Unpacked | Folded
    text: str  # summary (or Consolidated Detail) text and keywords: what the worker matches against


@dataclass(frozen=True)
class ParsedPrompt:
    query: str
    final: bool
    consulted: Counter[str]  # Consult count per target id, from the Reasoning_Trace
    nodes: list[Candidate]  # every <Node> of the Linear_Flow, nested ones included, in document order
    folded: list[Candidate]  # the roots listed in <Background_Context>, in order


def _own_text(node: etree._Element) -> str:
    """What a node says about itself: its Summary, or a Consolidated node's Detail text."""
    if node_type(node) == "Consolidated" and node_view(node) == "Detail":
        return node.findtext("Content") or ""
    return node.findtext("Summary") or ""


def _flow_nodes(root: etree._Element) -> list[Candidate]:
    return [
        Candidate(node.get("id", ""), node_type(node), node_view(node), f"{_own_text(node)} {node.get('keywords', '')}")
        for flow in root.iter("Linear_Flow")
        for node in flow.iter("Node")
    ]


def _folded_roots(root: etree._Element) -> list[Candidate]:
    lines = "\n".join(element.text or "" for element in root.iter("Background_Context")).splitlines()
    matches = (_BACKGROUND_LINE.match(line.strip()) for line in lines)
    return [Candidate(m.group(1), "", FOLDED, m.group(2)) for m in matches if m]


def parse_prompt(document: str | etree._Element) -> ParsedPrompt:
    root = _root(document)
    return ParsedPrompt(
        query=root.findtext("Query") or "",
        final=st_nodes(root).get("FINAL_ROUND") == "true",
        consulted=Counter(step.get("target", "") for step in root.iter("Step") if step.get("action") == "Consult"),
        nodes=_flow_nodes(root),
        folded=_folded_roots(root),
    )


# -- the policy ----------------------------------------------------------------------


def _zoomable(node: Candidate, consulted: Counter[str]) -> bool:
    """Summary → Detail takes one Consult; a Consolidated Detail → Unpacked takes a second."""
    if node.view in ("Summary", FOLDED):
        return consulted[node.id] < 1
    if node.view == "Detail" and node.type == "Consolidated":
        return consulted[node.id] < 2
    return False


def _score(query_terms: set[str], node: Candidate) -> tuple[int, int]:
    words = terms(node.text)
    return len(query_terms.intersection(words)), sum(1 for w in words if w in query_terms)


def choose_consult(prompt: ParsedPrompt, *, background: bool = False) -> str | None:
    """The id to Consult next, or None to answer. ``background``: folded roots are candidates too."""
    if prompt.final:
        return None
    query_terms = set(terms(prompt.query))
    candidates = [*prompt.folded, *prompt.nodes] if background else prompt.nodes  # document order
    best: tuple[tuple[int, int], str] | None = None
    for node in candidates:
        if not _zoomable(node, prompt.consulted):
            continue
        score = _score(query_terms, node)
        if score[0] > 0 and (best is None or score > best[0]):  # strict: earlier nodes win ties
            best = (score, node.id)
    return best[1] if best else None


def worker_reply(document: str | etree._Element, *, background: bool = False) -> str:
    """What the simulated worker says to a ``<PagedContext>``: one Consult, or ``ANSWER``."""
    target = choose_consult(parse_prompt(document), background=background)
    return ANSWER if target is None else f'Consult("{CONSULT_REASON}", "{target}")'


def simulated_worker(recorded: Recorded) -> Reply:
    """The FakeUpstream reply: Consult the best-overlapping Linear_Flow node, or answer.

    Calls with another ``x-pcp-role`` (or none) get ``"ok"``; a streamed request gets SSE;
    each in the shape of the API called (chat completions, Responses, Messages).
    """
    return _reply(recorded, background=False)


def background_worker(recorded: Recorded) -> Reply:
    """As ``simulated_worker``, but roots folded into Background_Context may be Consulted too."""
    return _reply(recorded, background=True)


def _reply(recorded: Recorded, *, background: bool) -> Reply:
    if recorded.headers.get("x-pcp-role") == "worker":
        text = worker_reply(worker_document(recorded), background=background)
    else:
        text = "ok"
    return answer(api_of(recorded), text, stream=_wants_stream(recorded))


def _wants_stream(recorded: Recorded) -> bool:
    try:
        return bool(recorded.json.get("stream"))
    except (ValueError, AttributeError):
        return False
