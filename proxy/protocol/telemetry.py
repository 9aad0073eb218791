"""What a protocol-mode request did, for programs (response headers), people (the inspector) and operators (metrics, the log).

``RequestTelemetry`` follows one request: it watches the rounds as the
driver runs them (each worker call's ``Synthesis``: what was shown at which
view, and the directives before it), gives the response its headers, and,
where the request ends, keeps its ``RequestTrace`` in ``Traces`` (a bounded
store in memory, per session, within the caller's namespace), counts it into
the histograms and writes one log line.

Headers (``RequestTelemetry.headers``):

* ``x-pcp-tokens-saved`` — the input the request was billed against what the
  same request sent untouched would have been, priced as providers bill a
  prompt cache (``pcp_core.billing``: a cached token at ``cached_input_price``),
  in uncached-token units: negative when paging cost more. What the upstream
  says its cache served (``cached_tokens``, ``cache_read_input_tokens``)
  counts where it says it; elsewhere the proxy's reading of what each call
  shares with the one before it;
* ``x-pcp-pages`` — ``shown-detail/shown-summary/folded/total`` of the
  answering round: every page of the session is one of these; ``folded`` is
  what the worker saw no text of (a root's one line in Background_Context,
  a page inside a container shown by its summary);
* ``x-pcp-consulted`` — the ids the worker opened with ``Consult``, in order;
* ``x-pcp-trace`` — the id to find this request by (``/v1/pcp/requests/{id}``,
  the inspector, the log).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Generator
from typing import Any

import msgspec

from pcp_core import CallRouter, CallWorker, Effect, Outcome, Paged, PagedHistory, Prepared, Step, View
from pcp_core.billing import billed, cached, cached_at_most

from .. import headers as pcp
from ..logs import TRACE_ID
from ..metrics import Metrics
from .control import Control

__all__ = ["PageCounts", "RequestTelemetry", "RequestTrace", "RoundTrace", "Traces"]

log = logging.getLogger("pcp.requests")

TRACES_PER_SESSION = 32  # the latest requests of a session
TRACED_SESSIONS = 512  # sessions with traces, the least recently traced forgotten first


class RoundTrace(msgspec.Struct):
    round: int
    final: bool
    tokens: int  # prompt tokens the worker call carried
    shared: int = 0  # of them, those the call before it had too (the previous round's, or the previous request's frame)
    seconds: float = 0.0  # the call, until its answer's last byte
    views: dict[str, str] = {}  # page id -> the view it was shown at (Detail | Summary | Unpacked)
    folded: list[str] = []  # roots folded into Background_Context
    dehydrated: list[str] = []  # pages wanted above the view the budget let them have
    directives: list[Step] = []  # what the worker asked for at the end of this round


class PageCounts(msgspec.Struct):
    """The answering round's pages: shown in detail, shown by summary, folded; of ``total``."""

    detail: int = 0
    summary: int = 0
    folded: int = 0
    total: int = 0

    def header(self) -> str:
        """``x-pcp-pages``: detail/summary/folded/total."""
        return f"{self.detail}/{self.summary}/{self.folded}/{self.total}"


class RequestTrace(msgspec.Struct, kw_only=True):
    id: str
    at: float  # seconds since 1970, as the request arrived
    model: str | None
    session: str = ""
    mode: str = "auto"  # as the request asked for it (x-pcp-mode-request): auto | force
    prompt_tokens: int  # the client's: the size of the history it sent
    messages: int = 0
    threshold: int
    budget: int
    rounds: list[RoundTrace] = []
    tokens_sent: int = 0
    # Input as providers bill it with a prompt cache, in uncached-token units: the request's, and the
    # same request's sent untouched; their difference (negative when paging cost more).
    billed: float = 0.0
    untouched: float = 0.0
    tokens_saved: int = 0
    # The input tokens of each, by how the provider bills them: read from its cache (at the cached price) or not.
    cached: int = 0
    uncached: int = 0
    untouched_cached: int = 0
    untouched_uncached: int = 0
    # The request as the client sent it fits the model's window (where it is known): one that does not could never
    # have gone untouched, so no saving is claimed against it (no x-pcp-tokens-saved).
    untouched_fits: bool = True
    cache_reported: bool = False  # the upstream reported what its cache served; else the proxy's reading
    pages: PageCounts = msgspec.field(default_factory=PageCounts)
    consulted: list[str] = []
    hot: list[str] = []  # pages the Router made Hot (evidence shown first), and the latest turns
    paged: Paged | None = None
    kind: str = ""  # answer | client_tool_calls
    seconds: float = 0.0  # until the request's last round ended


class Traces:
    """The latest traces of each session, per caller's namespace; bounded, in memory only."""

    def __init__(self, per_session: int = TRACES_PER_SESSION, sessions: int = TRACED_SESSIONS):
        self.per_session, self.sessions_kept = per_session, sessions
        self.sessions: OrderedDict[tuple[str, str], deque[RequestTrace]] = OrderedDict()
        self.ids: dict[str, tuple[str, str]] = {}  # trace id -> (namespace, session)
        self.lock = threading.Lock()  # the inspector's handlers may read from threads

    def add(self, namespace: str, trace: RequestTrace) -> None:
        """Keep ``trace`` under its session, forgetting the oldest past the bounds."""
        key = (namespace, trace.session)
        with self.lock:
            kept = self.sessions.get(key)
            if kept is None:
                kept = self.sessions[key] = deque()
            self.sessions.move_to_end(key)
            if len(kept) >= self.per_session:
                self.ids.pop(kept.popleft().id, None)
            kept.append(trace)
            self.ids[trace.id] = key
            while len(self.sessions) > self.sessions_kept:
                for old in self.sessions.popitem(last=False)[1]:
                    self.ids.pop(old.id, None)

    def of_session(self, namespace: str, session: str) -> list[RequestTrace]:
        """The traces kept of a session of ``namespace``, oldest first."""
        with self.lock:
            return list(self.sessions.get((namespace, session), ()))

    def get(self, namespace: str, trace_id: str) -> RequestTrace | None:
        """The trace ``trace_id`` if it is one of ``namespace``'s: another caller's is not found."""
        with self.lock:
            key = self.ids.get(trace_id)
            if key is None or key[0] != namespace:
                return None
            return next((t for t in self.sessions[key] if t.id == trace_id), None)

    def sessions_of(self, namespace: str) -> dict[str, int]:
        """The sessions of ``namespace`` with traces, and how many."""
        with self.lock:
            return {session: len(kept) for (owner, session), kept in self.sessions.items() if owner == namespace}


class RequestTelemetry:
    """One protocol-mode request, followed from its arrival to the end of its last round."""

    def __init__(
        self,
        traces: Traces,
        metrics: Metrics,
        namespace: str,
        model: str | None,
        prompt_tokens: int,
        control: Control,
        messages: int = 0,
        message_tokens: int = 0,
    ):
        self.traces, self.metrics, self.namespace = traces, metrics, namespace
        self.message_tokens = message_tokens  # the tokens of the request's messages alone (0: not counted), its tools aside
        self.id = secrets.token_hex(8)
        self.started = time.perf_counter()
        policy = control.policy
        self.trace = RequestTrace(
            id=self.id, at=time.time(), model=model, mode=control.mode, prompt_tokens=prompt_tokens, messages=messages,
            threshold=policy.threshold, budget=policy.rounds.budget,
        )  # fmt: skip
        self.calls: list[CallWorker] = []
        self.price = policy.rounds.cached_input_price
        self.trace.untouched_fits = not policy.window or prompt_tokens <= policy.window
        self.untouched_read = 0  # what the provider's cache would serve of the request sent untouched
        self.reported: Any = None  # the request's summed usage (``apis.codec.Usage``), as the upstream reports it
        self.total = 0
        self.answered = False  # the response has started: its latency is counted
        TRACE_ID.set(self.id)  # this request's log lines carry it (logs.py)

    # -- the rounds, as the driver runs them ----------------------------------------------
    def watch(self, prepared: Prepared, rounds: Generator[Effect, Any, Outcome]) -> Generator[Effect, Any, Outcome]:
        """The ``rounds`` as they are, each worker call recorded and each upstream call timed."""
        self.total = _total(prepared.pages if prepared.pages is not None else prepared.session.pages)
        self.trace.paged = prepared.paged
        value = None
        while True:
            try:
                effect = rounds.send(value)
            except StopIteration as done:
                return done.value
            if isinstance(effect, CallWorker):
                self._called(effect)
            started = time.perf_counter()
            value = yield effect
            seconds = time.perf_counter() - started
            if isinstance(effect, CallWorker):
                self.trace.rounds[-1].seconds = seconds
                self.metrics.observe("pcp_upstream_seconds", seconds, role="worker")
            elif isinstance(effect, CallRouter):
                self.metrics.observe("pcp_upstream_seconds", seconds, role="router")

    def _called(self, call: CallWorker) -> None:
        """Record a worker call: the round it starts, and the directives that ended the one before."""
        synthesis = call.synthesis
        if self.calls:  # what the worker asked for at the end of the round before
            self.trace.rounds[-1].directives = call.trace[len(self.calls[-1].trace) :]
        self.calls.append(call)
        views = {page: str(view) for page, view in synthesis.shown.items()}
        self.trace.rounds.append(
            RoundTrace(call.round, call.final, synthesis.tokens, call.shared, views=views, folded=list(synthesis.folded), dehydrated=list(synthesis.dehydrated))
        )

    def priced(self, untouched_read: int, usage: Any) -> None:
        """What prices the request: the tokens the request sent untouched would find in the cache (the
        request before it in the conversation), and its usage as the upstream reports it (``Usage``)."""
        self.untouched_read, self.reported = untouched_read, usage

    # -- what the response says ------------------------------------------------------------
    def headers(self) -> dict[str, str]:
        """The telemetry headers, as the rounds stand when the response starts (the answering round is the latest)."""
        if not self.answered:
            self.answered = True
            self.metrics.observe("pcp_request_seconds", time.perf_counter() - self.started, mode="protocol")
        trace = self._summed()
        saved = {pcp.TOKENS_SAVED: str(trace.tokens_saved)} if trace.untouched_fits else {}
        return {
            **saved,
            pcp.PAGES: trace.pages.header(),
            pcp.CONSULTED: ",".join(trace.consulted),
            pcp.TRACE: self.id,
        }

    def _summed(self) -> RequestTrace:
        """The trace with its totals as the rounds stand: tokens sent, billed against untouched, pages, Consults."""
        trace = self.trace
        trace.tokens_sent = sum(r.tokens for r in trace.rounds)
        read = self.reported.cache_read() if self.reported is not None else None
        trace.cache_reported = read is not None
        if read is None:  # the proxy's reading: each call's prefix the one before it had
            trace.billed = sum(billed(r.tokens, cached(r.shared), self.price) for r in trace.rounds)
            trace.cached = sum(min(cached(r.shared), r.tokens) for r in trace.rounds)
            trace.uncached = trace.tokens_sent - trace.cached
        else:
            sent = self.reported.prompt_tokens or trace.tokens_sent
            trace.billed = billed(sent, read, self.price)
            trace.cached = min(read, sent)
            trace.uncached = sent - trace.cached
        trace.untouched = billed(trace.prompt_tokens, cached_at_most(self.untouched_read), self.price)
        trace.untouched_cached = min(cached_at_most(self.untouched_read), trace.prompt_tokens)
        trace.untouched_uncached = trace.prompt_tokens - trace.untouched_cached
        trace.tokens_saved = round(trace.untouched - trace.billed) if trace.untouched_fits else 0
        if self.calls:
            trace.pages = _counts(trace.rounds[-1].views, self.total)
            trace.consulted = list(dict.fromkeys(step.target for step in self.calls[-1].trace if step.action == "Consult"))
        return trace

    # -- where the request ends ------------------------------------------------------------
    def ended(self, outcome: Outcome, prepared: Prepared | None) -> None:
        """Keep the request's trace under its session, count it, and log it."""
        trace = self._summed()
        trace.session = prepared.session.id if prepared is not None else ""
        trace.kind = outcome.kind
        trace.hot = [page for page, state in outcome.pages.items() if state.activation == "Hot"]
        trace.seconds = time.perf_counter() - self.started
        self.traces.add(self.namespace, trace)
        self.metrics.observe("pcp_rounds_per_request", len(trace.rounds))
        self.metrics.inc("pcp_billed_input_tokens_total", round(trace.billed), request="paged")
        self.metrics.inc("pcp_input_tokens_total", trace.cached, request="paged", cache="cached")
        self.metrics.inc("pcp_input_tokens_total", trace.uncached, request="paged", cache="uncached")
        if trace.untouched_fits:
            self.metrics.observe("pcp_tokens_saved_per_request", trace.tokens_saved)
            self.metrics.inc("pcp_billed_input_tokens_total", round(trace.untouched), request="untouched")
            self.metrics.inc("pcp_input_tokens_total", trace.untouched_cached, request="untouched", cache="cached")
            self.metrics.inc("pcp_input_tokens_total", trace.untouched_uncached, request="untouched", cache="uncached")
        else:
            self.metrics.inc("pcp_requests_not_comparable_total")
        fields = {
            "session": trace.session,
            "model": trace.model,
            "rounds": len(trace.rounds),
            "prompt_tokens": trace.prompt_tokens,
            "tokens_sent": trace.tokens_sent,
            "tokens_saved": trace.tokens_saved,
            "billed": round(trace.billed),
            "untouched": round(trace.untouched),
            "pages": trace.pages.header(),
            "consulted": trace.consulted,
            "seconds": round(trace.seconds, 4),
        }
        log.info(
            "protocol request %s: session %s, %d round(s), %d prompt tokens sent for %d, pages %s",
            self.id,
            trace.session,
            len(trace.rounds),
            trace.tokens_sent,
            trace.prompt_tokens,
            trace.pages.header(),
            extra={"trace": self.id, "fields": fields},
        )


def _total(pages: PagedHistory) -> int:
    """Every page the rounds could address: the history's, and the Draft pages of its File blocks."""
    return len(pages.leaves) + len(pages.containers) + sum(len(block.drafts) for block in pages.blocks)


def _counts(views: dict[str, str], total: int) -> PageCounts:
    """The answering round's pages shown in detail, by summary, and folded, of ``total``."""
    detail = sum(1 for view in views.values() if view == View.DETAIL)
    summary = len(views) - detail  # by its summary, or (Unpacked) by its keywords around the pages inside
    return PageCounts(detail, summary, max(total - detail - summary, 0), total)
