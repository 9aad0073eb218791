"""The intent-driven round loop (§VI) as a generator of effects.

The engine does no I/O. It yields effects — ``Similarity`` (the host sends
back cosines, or None), ``CallRouter`` (the router model's reply) and
``CallWorker`` (the host sends back a ``WorkerReply``) — and when the loop ends, returns an ``Outcome``::

    loop = run_rounds(context, index, count)
    effect = next(loop)
    while True:
        try:
            effect = loop.send(fulfil(effect))
        except StopIteration as done:
            outcome = done.value
            break

One request: anchor the intent (head + tail), address pages (scored by BM25,
plus dense recall when the host embeds; a router model, when the host has one, picks
among the best; those become Hot, the latest turns stay in Detail), synthesize, call the
worker, parse its directives, apply them to the view state, and loop — at most
``max_rounds`` calls, the last of which forbids directives and must answer.

The Draft pages of the history's PBlocks (large messages, ``pcp_core.pblock``)
are addressed with the history's pages; the drafts a round shows above Summary
are solidified (§VI.5), and the ``Outcome`` carries them for the host to keep.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Sequence
from typing import Any, Literal

import msgspec

from .directives import BusFault, Consult, Directive, Explore, Shelve, parse_directives
from .index import Activation, PageIndex, UnknownPage
from .pages import ConsolidatedPage, Origin, Page, View
from .pblock import around_handle, solidify
from .router import ROUTER_CANDIDATES, Intent, anchor_intent, broad_match, dense_scores, dense_texts, lexical_scores, precision_selection, router_prompt, unit_texts
from .timeline import moment
from .synthesis import Step, Synthesis, SynthesisRequest, synthesize
from .tokens import CountText
from .views import ViewState

__all__ = [
    "DIRECTIVE_TOOLS",
    "CallRouter",
    "CallWorker",
    "Effect",
    "Outcome",
    "RoundContext",
    "Similarity",
    "WorkerReply",
    "calls_client_tool",
    "run_rounds",
]

HOT_PAGES = 40  # pages the Router may make Hot; the budget decides how many show
# The Router's best pages, which go before the roots' overview in round 0 and stay in
# every round after: the worker answers from one prompt, whichever round it is.
FOCUS = 4
# Of the budget, for roots shown by their Summary; the rest fold into Background_Context.
# Evidence first: on LoCoMo a smaller overview recalled more (0.25 → 0.10: +1 point).
OVERVIEW_SHARE = 0.10
INDEXED_PAGES = 6  # the next-ranked pages, shown by summary as Consult targets
RECENT_PAGES = 2  # the latest Original pages, kept verbatim while they fit
EXPLORE_HITS = 3
DIFFUSION_PAGES = 3  # Original pages a Consult on a container brings in beside it
NO_ANSWER = "I could not find that in our conversation."

# The same three directives as native tools, for PCP_DIRECTIVE_CHANNEL=tools.
DIRECTIVE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": f"pcp_{name.lower()}",
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string"} for p in params},
                "required": list(params),
            },
        },
    }
    for name, params, description in (
        ("Consult", ("reason", "id"), "Open a page of the PagedContext one level: Summary to Detail, a Consolidated Detail to Unpacked."),
        ("Shelve", ("reason", "id"), "Fold a page of the PagedContext you no longer need."),
        ("Explore", ("reason", "handle", "keywords"), "Search the pages under a page id (or 'history') for comma-separated keywords."),
    )
]
_TOOL_DIRECTIVES = {f"pcp_{cls.__name__.lower()}": cls for cls in (Consult, Shelve, Explore)}


class RoundContext(msgspec.Struct, kw_only=True):
    query: str
    head: str = ""
    current_time: str
    budget: int
    max_rounds: int
    channel: Literal["text", "tools"] = "text"
    client_tools: list[dict[str, Any]] = []
    # Tokens of tool definitions sent with each worker call (the host counts them).
    reserved_tokens: int = 0
    # Ask the host for embeddings and fuse dense recall with BM25.
    dense: bool = False
    # Ask the host's router model to pick among the best-ranked pages (§VI.2).
    router: bool = False


class Similarity(msgspec.Struct, frozen=True):
    """Ask the host how close in meaning each of ``texts`` is to ``query``.

    The reply: the cosine of their embeddings, one per text in order (NaN for
    a text the host has not embedded yet), or None if it has none to offer.
    """

    query: str
    texts: list[str]


class CallRouter(msgspec.Struct, frozen=True):
    """Ask the host's router model; the host sends back its reply text, or None if the call failed."""

    messages: list[dict[str, str]]


class CallWorker(msgspec.Struct, frozen=True):
    messages: list[dict[str, str]]
    round: int
    final: bool
    tools: list[dict[str, Any]]
    synthesis: Synthesis


class WorkerReply(msgspec.Struct, frozen=True):
    text: str
    tool_calls: list[dict[str, Any]] = []
    # The host already streamed this reply to the client as the answer.
    delivered: bool = False


class Outcome(msgspec.Struct, frozen=True):
    kind: Literal["answer", "client_tool_calls"]
    text: str
    rounds: int
    trace: list[Step]
    intent: Intent
    # The formal pages Draft pages were solidified into at the ends of the rounds (§VI.5).
    solidified: list[Page] = []


Effect = Similarity | CallRouter | CallWorker


def run_rounds(context: RoundContext, index: PageIndex, count: CountText) -> Generator[Effect, Any, Outcome]:
    views = ViewState(index)
    leaves = list(index.leaves())  # the history's, and the Draft pages of its PBlocks
    said = [page for page in leaves if page.origin == Origin.HISTORY]
    now = moment(context.current_time)
    # A query that is a File block (``RoundContext.query``) is asked by what follows the file;
    # what precedes it weighs as the head does.
    before, asked = around_handle(context.query)
    intent = anchor_intent(f"{context.head}\n{before}".strip(), asked, said[-1].summary if said else "", now)
    texts = unit_texts(leaves)
    lexical = lexical_scores(intent, texts)  # before the dense reading: the host encodes the query meanwhile
    dense = None
    if context.dense and texts:
        cosines = yield Similarity(intent.text, dense_texts(texts))
        if cosines is not None:
            dense = dense_scores(cosines, len(texts))
    ranked = broad_match(intent, leaves, lexical, dense)

    def explore(keywords: Sequence[str]) -> list[str]:
        """The worker's own search: its keywords (and the times they name) addressed as a query is."""
        wanted = anchor_intent("", ", ".join(keywords), now=now)
        return broad_match(wanted, leaves, lexical_scores(wanted, texts))

    if context.router and ranked:
        candidates = ranked[:ROUTER_CANDIDATES]
        reply = yield CallRouter(router_prompt(intent, [index.get(p) for p in candidates], context.budget, count))
        if reply is not None:
            ranked = precision_selection(ranked, reply, candidates)
    hot, indexed = ranked[:HOT_PAGES], ranked[HOT_PAGES : HOT_PAGES + INDEXED_PAGES]
    overview = list(reversed(index.roots))
    recent = [page.id for page in said[-RECENT_PAGES:]][::-1]
    for page_id in hot + recent:
        views.raise_to(page_id, View.DETAIL, unfold=False)  # Hot: injected directly
        index.activate(page_id, Activation.HOT)
        index.touch(page_id)
    standalone: set[str] = set()  # pages the last synthesis showed outside their container
    consulted: list[str] = []  # newest first: the worker's own choices come before the Router's
    diffused: list[str] = []  # newest first: what reactive diffusion brought in beside them
    read: set[str] = set()  # pages the worker has been shown in Detail
    solid: dict[str, Page] = {}  # Draft pages solidified so far, by id
    trace: list[Step] = []
    faulted = False
    tools = _tools(context)

    for round_no in range(context.max_rounds):
        final = faulted or round_no == context.max_rounds - 1
        request = SynthesisRequest(
            current_time=context.current_time,
            query=context.query,
            head=context.head,
            trace=list(trace),
            final=final,
            budget=context.budget,
            # Round 0: the focus, the overview (§7.2 Level 1), the rest; after a Consult, see _priorities.
            priorities=_priorities(consulted, diffused, hot, read, overview, indexed, recent, final),
            indexed=indexed,
            reserved_tokens=context.reserved_tokens,
            overview_budget=int(OVERVIEW_SHARE * context.budget),
        )
        synthesis = synthesize(index, views.raised(), request, count)
        standalone = set(synthesis.standalone)
        read.update(p for p, view in synthesis.shown.items() if view == View.DETAIL)
        # What the round shows is what its end finds read: those drafts become formal pages.
        solid.update((page.id, page) for page in solidify(synthesis.shown, index))
        reply = yield CallWorker(messages=synthesis.messages, round=round_no, final=final, tools=tools, synthesis=synthesis)

        if calls_client_tool(reply.tool_calls, context.client_tools):
            return Outcome("client_tool_calls", reply.text, round_no + 1, trace, intent, list(solid.values()))
        text, directives, faults = _read(reply)
        if reply.delivered or final or not (directives or faults):
            return Outcome("answer", text.strip() or NO_ANSWER, round_no + 1, trace, intent, list(solid.values()))
        for fault in faults:
            trace.append(Step("BusFault", fault.raw[:120], fault.reason))
        for directive in directives:
            step, asked = _apply(directive, views, index, explore, round_no, standalone)
            trace.append(step)
            faulted |= step.action == "BusFault"
            consulted = _still_raised([*asked, *consulted], views)
            diffused = _still_raised([*_diffuse(directive, ranked, index, views, round_no, read), *diffused], views)
        # A Bus Fault is explained once, in the trace; the next round must answer (§2.4).
        faulted |= bool(faults)
        views.settle(round_no)
        index.tick()
    raise AssertionError("unreachable: the last round always answers")


def _priorities(consulted: list[str], diffused: list[str], hot: list[str], read: set[str], overview: list[str], indexed: list[str], recent: list[str], final: bool = False) -> list[str]:
    """What to show first. Round 0: the intent's focus, the overview (§7.2 Level 1), the rest.

    After a Consult: what the worker asked for and what diffusion found in
    it that it has not read, then the focus (Overflow Governance dehydrates
    the pages outside it, §III.2). Then, while the worker may still ask, the
    pages it has not read come before the overview and the pages it has
    seen; the final round cannot ask, and the rest of the Router's best
    pages follow in its order. The worker answers from one prompt, and one
    that asks for more has not always read all it needs.
    """
    focus, rest = hot[:FOCUS], hot[FOCUS:]
    if not read:
        return [*consulted, *diffused, *focus, *overview, *rest, *indexed, *recent]
    fresh = [p for p in diffused if p not in read]
    stale = [p for p in diffused if p in read]
    if final:
        return [*consulted, *fresh, *focus, *rest, *overview, *stale, *indexed, *recent]
    unread = [p for p in rest if p not in read]
    seen = [*stale, *(p for p in rest if p in read)]
    return [*consulted, *fresh, *focus, *unread, *overview, *seen, *indexed, *recent]


def _still_raised(page_ids: list[str], views: ViewState) -> list[str]:
    """``page_ids`` without repeats, less those a directive folded back to Summary."""
    return [p for p in dict.fromkeys(page_ids) if views.view(p) != View.SUMMARY]


def _tools(context: RoundContext) -> list[dict[str, Any]]:
    directive_tools = DIRECTIVE_TOOLS if context.channel == "tools" else []
    return [*context.client_tools, *directive_tools]


def _tool_name(tool_or_call: dict[str, Any]) -> str | None:
    function = tool_or_call.get("function")  # a client's tool of another type has none
    return function.get("name") if isinstance(function, dict) else None


def calls_client_tool(tool_calls: list[dict[str, Any]], client_tools: list[dict[str, Any]]) -> bool:
    """Whether the worker called one of the client's own tools (which ends the loop)."""
    names = {_tool_name(tool) for tool in client_tools}
    return any(_tool_name(call) in names for call in tool_calls)


def _read(reply: WorkerReply) -> tuple[str, list[Directive], list[BusFault]]:
    """Directives from the text and from native tool calls, and the text without them."""
    text, directives, faults = parse_directives(reply.text)
    for call in reply.tool_calls:
        function = call.get("function") or {}
        raw = f"{function.get('name')}({function.get('arguments', '')})"
        kind = _TOOL_DIRECTIVES.get(function.get("name"))
        if kind is None:  # neither a directive nor one of the client's tools
            faults.append(BusFault(raw=raw, reason=f"there is no tool named {function.get('name')!r}"))
            continue
        try:
            args = json.loads(function.get("arguments") or "{}")
            if not isinstance(args, dict):
                raise TypeError(f"expected an object, got {type(args).__name__}")
            if kind is Explore and isinstance(args.get("keywords"), str):  # "a, b" as well as ["a", "b"]
                args["keywords"] = args["keywords"].split(",")
            directive = msgspec.convert(args, kind)
            if isinstance(directive, Explore):
                directive = msgspec.structs.replace(directive, keywords=tuple(k.strip() for k in directive.keywords if k.strip()))
            directives.append(directive)
        except (ValueError, TypeError, msgspec.ValidationError) as exc:
            faults.append(BusFault(raw=raw, reason=f"{function.get('name')} arguments are not valid: {exc}"))
    return text, directives, faults


def _apply(directive: Directive, views: ViewState, index: PageIndex, explore: Callable[[Sequence[str]], list[str]], round_no: int, standalone: set[str]) -> tuple[Step, list[str]]:
    """Carry out one directive; returns its trace step and the pages it raised."""
    name = type(directive).__name__
    target = directive.handle if isinstance(directive, Explore) else directive.id
    try:
        if isinstance(directive, Consult):
            # A page shown on its own zooms in place; any other opens its path (§7.2).
            changes = views.consult(directive.id, round_no, unfold=directive.id not in standalone)
            index.touch(directive.id)
            return _step(name, target, directive.reason, changes), [directive.id]
        if isinstance(directive, Shelve):
            changes = views.shelve(directive.id, round_no)
            index.activate(directive.id, Activation.SHELVED)
            return _step(name, target, directive.reason, changes), []
        scope = None if directive.handle in ("history", "") else _subtree(index, directive.handle)
        hits = [p for p in explore(directive.keywords) if scope is None or p in scope][:EXPLORE_HITS]
        for page_id in hits:
            views.raise_to(page_id, View.DETAIL, round_no, unfold=False)
            index.touch(page_id)
        return Step(name, target, directive.reason, f"found {', '.join(hits) or 'nothing'}"), hits
    except UnknownPage as missing:
        return Step("BusFault", target, f"{name}: {missing}; use an id shown in the PagedContext"), []


def _diffuse(directive: Directive, ranked: list[str], index: PageIndex, views: ViewState, round_no: int, read: set[str]) -> list[str]:
    """Reactive diffusion (§VI.4): zooming into a container re-addresses inside it.

    The Original pages under the consulted container that rank best for the
    intent, and that the worker has not been shown in Detail in any round
    (``read``), are injected in Detail beside it — so a Consult on a summary
    reaches new evidence, not only another summary or pages already read.
    """
    if not isinstance(directive, Consult) or directive.id not in index or not isinstance(index.get(directive.id), ConsolidatedPage):
        return []
    scope = _subtree(index, directive.id)
    found = [p for p in ranked if p in scope and p not in read][:DIFFUSION_PAGES]
    for page_id in found:
        views.raise_to(page_id, View.DETAIL, round_no, unfold=False)
        index.touch(page_id)
    return found


def _subtree(index: PageIndex, handle: str) -> set[str]:
    page = index.get(handle)
    if not isinstance(page, ConsolidatedPage):
        return {page.id}
    return {leaf.id for leaf in index.leaves([handle])}


def _step(action: str, target: str, reason: str, changes: Sequence[Any]) -> Step:
    result = "; ".join(f"{c.page_id} {c.before}→{c.after}" for c in changes) or "no change"
    return Step(action, target, reason, result)
