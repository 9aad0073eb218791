"""The routes of the APIs the proxy serves. Thin: read, measure, hand over, relay.

A request of a paged API (``apis``: chat completions, Responses, Messages) is
read by its API, counted, and either paged (``protocol.drive``) or forwarded as
it came (``forward``). Every other ``/v1`` path is forwarded. The proxy key is
checked by the routers' guard (``keys.proxy_key``) before any handler runs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from time import perf_counter
from typing import Any

from litestar import HttpMethod, Request, Response, get, route
from litestar.di import NamedDependency

from pcp_core import asks_to_compact
from pcp_core.decision import Passthrough, Protocol, Refuse

from .. import headers as pcp
from ..apis.chat import CHAT
from ..apis.codec import Api
from ..apis.messages import MESSAGES
from ..apis.responses import RESPONSES
from ..errors import ClientError, PcpError
from ..memory.hooks import remember_forwarded
from ..protocol.context import paged_headers
from ..protocol.drive import serve_protocol
from ..protocol.refusals import TooLong, refused_window
from ..services import Services
from .agent_compaction import answered, marked_behind
from .arrival import Arrival, arrive, asked_at, read_api, read_large
from .context_management import COMPACT_PATH, compacted
from .error_handlers import not_the_proxys, speaks_anthropic
from .forward import forward, relayed, unless_client_leaves, upstream_target
from .keys import check_metrics_key, shows_details, upstream_headers

__all__ = ["API_ROUTES", "OPEN_ROUTES", "RESERVED"]

log = logging.getLogger("pcp.proxy")

# Every method a /v1 path may be called with; what the proxy does not page is forwarded.
METHODS = [HttpMethod.GET, HttpMethod.HEAD, HttpMethod.POST, HttpMethod.PUT, HttpMethod.PATCH, HttpMethod.DELETE]
PASSTHROUGH = {pcp.MODE: "passthrough"}


@route("/chat/completions", http_method=METHODS, status_code=200)
async def chat_completions(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """OpenAI's chat completions: a POST is paged as ``pcp_core.decision`` decides; the stored completions' calls are forwarded."""
    if request.method != "POST":  # stored completions (list, retrieve, update, delete) are not paged
        return await forwarded(request, services)
    return await paged_api(request, services, CHAT)


@route("/responses", http_method=METHODS, status_code=200)
async def responses(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """OpenAI's Responses API: paged as chat is, in its stateless form (``apis.responses``)."""
    if request.method != "POST":  # a stored response (retrieve, delete, cancel, its input items) is not paged
        return await forwarded(request, services)
    return await paged_api(request, services, RESPONSES)


@route("/responses/compact", http_method=[HttpMethod.POST], status_code=200)
async def responses_compact(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """OpenAI's compaction (``POST /responses/compact``): the upstream's own where it has it, else the proxy's, whose
    compaction item is a handle to the history's pages (``context_management.compacted``)."""
    upstream, settings = services.upstream, services.settings
    translation = services.translation_of(RESPONSES)
    path = asked_at(dataclasses.replace(RESPONSES, path=COMPACT_PATH), request).path
    body = await request.body()
    headers = upstream_headers(settings, request.headers, anthropic=False)
    if not (settings.serve_compact or translation.mode == "always" or COMPACT_PATH in translation.lacking):
        answer = await upstream.open("POST", path, content=body, headers=headers)
        try:
            content = await answer.aread()
        finally:
            await answer.aclose()
        if translation.mode == "never" or answer.status_code not in (404, 405):
            services.metrics.inc("pcp_requests_total", mode="passthrough")
            return Response(content, **relayed(answer, PASSTHROUGH))
        translation.lacking.add(COMPACT_PATH)
        log.info("the upstream answered POST %s with %s: the proxy compacts from now on", COMPACT_PATH, answer.status_code)
    namespace = services.namespaces.of(request.headers)
    compaction, session = await compacted(services, namespace, headers, body)
    services.metrics.inc("pcp_requests_total", mode="protocol")
    return Response(compaction, headers={pcp.MODE: "protocol", pcp.SESSION: session})


@route("/messages", http_method=METHODS, status_code=200)
async def messages(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """Anthropic's Messages API: paged as chat is (``apis.messages``)."""
    if request.method != "POST":
        return await forwarded(request, services)
    return await paged_api(request, services, MESSAGES)


async def paged_api(request: Request[Any, Any, Any], services: Services, api: Api, again: bool = False) -> Response[Any]:
    """A request of ``api``: read and counted once, then paged or forwarded as ``pcp_core.decision`` decides. Forwarded
    and refused as longer than its model's window, it is decided ``again``, within the window the refusal named
    (``protocol.refusals``)."""
    started = perf_counter()
    arrival = await arrive(request, services, api)
    arrival.refused = again
    compaction = await _agent_compaction(arrival) if arrival.compacting else None
    if compaction is not None:
        return compaction
    decision = await read_large(arrival.body, arrival.decided)
    if isinstance(decision, Refuse):
        raise _too_large(decision, arrival.counted.tokens)
    if isinstance(decision, Protocol):
        return await _in_protocol_mode(request, arrival, decision)
    try:
        response = await _untouched(request, arrival, decision)
    except TooLong as refused:
        model, tokens = arrival.counted.reading.model, arrival.counted.tokens
        assert model is not None
        window = refused.refusal.in_our_count(tokens)
        services.controls.learn(model, window)
        log.info("the upstream refused %d prompt tokens as longer than %s's window: %d tokens from now on", tokens, model, window)
        return await paged_api(request, services, api, again=True)
    services.metrics.observe("pcp_request_seconds", perf_counter() - started, mode="passthrough")
    return response


async def _in_protocol_mode(request: Request[Any, Any, Any], arrival: Arrival, decision: Protocol) -> Response[Any]:
    """The request paged (``protocol.drive``); its answer, or its failure, tells the mode and why."""
    metrics = arrival.services.metrics
    extra = paged_headers(arrival.scope, arrival.counted.tokens, decision.reason)
    try:  # worker rounds run before any byte is sent: a client that leaves cancels them
        response = await unless_client_leaves(request, serve_protocol(arrival.handed_over(decision)))
    except PcpError as error:  # not a served request: not counted as one, and the client still learns the mode
        metrics.inc("pcp_requests_failed_total", mode="protocol", status=str(error.status))
        error.headers.update({pcp.MODE: "protocol", **extra})
        raise
    metrics.inc("pcp_requests_total", mode="protocol")
    response.headers.update(extra)
    return response


async def _untouched(request: Request[Any, Any, Any], arrival: Arrival, decision: Passthrough) -> Response[Any]:
    """The request forwarded as it came (a chat body with its PACT components and Hybrid mode's snapshot in place);
    ``TooLong`` where the upstream refuses it as longer than its model's window, and the proxy may page it instead."""
    services, api, reading = arrival.services, arrival.api, arrival.counted.reading
    if decision.reason == "budget-full":
        log.info("a request's query and attachments fill the context budget: forwarded untouched")
    answer = {**PASSTHROUGH, pcp.MODE_REASON: decision.reason}
    if reading.unreadable is None:
        answer[pcp.PROMPT_TOKENS] = str(arrival.counted.tokens)
    body, rewrite = await _chat_extras(arrival, answer) if api.chat_body else (arrival.forwarded, None)
    learns = reading.messages and reading.model is not None and not arrival.refused and decision.reason != "off"
    response = await forward(
        services.upstream_of(api), request, "POST", api.path, body, arrival.headers, answer, stream=reading.stream,
        failure=api.failure, rewrite=rewrite, as_stream=api.as_stream, too_long=refused_window if learns else None,
    )  # fmt: skip
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    if api.chat_body and arrival.scope is not None:  # memory: a forwarded request's messages, written back in the background
        assert response.status_code is not None  # forward's responses carry the upstream's status (None is Litestar's "the route's default")
        remember_forwarded(services.memory, arrival.scope, arrival.namespace, reading.messages, response.status_code, pcp.pinned_session(request.headers))
    return response


async def _agent_compaction(arrival: Arrival) -> Response[Any] | None:
    """An agent's compaction of its history, answered from the pages (``agent_compaction``); None: the request is not
    one, or turns protocol mode off."""
    services, reading = arrival.services, arrival.counted.reading
    control = services.controls.of(dict(arrival.headers), reading.model)  # a copy: the control headers stay for the decision
    if control.mode == "off":
        return None
    codec, conversation = await read_large(arrival.body, lambda: arrival.read_conversation(control.policy, keep=False))
    if not asks_to_compact(conversation):
        return None
    asked = json.loads(arrival.body)
    behind = marked_behind(services, arrival.namespace, arrival.body)
    return await answered(services, arrival.api, codec, conversation, asked, arrival.headers, arrival.namespace, control.policy, behind)


def _too_large(decision: Refuse, tokens: int) -> ClientError:
    """The 413 of a request whose query and attachments alone leave its budget no room for pages, and that is larger
    than the model's window."""
    policy = decision.policy
    return ClientError(
        f"this request cannot be paged: its query and attachments alone fill the context budget ({policy.rounds.budget:,} "
        f"tokens), and at {tokens:,} tokens it is larger than the model's context window ({policy.window:,}): raise PCP_CONTEXT_BUDGET",
        status=413,
        code="context_budget_too_small",
    )


async def _chat_extras(arrival: Arrival, answer: dict[str, str]) -> tuple[bytes, Any]:
    """A chat body below the threshold: the session's PACT components in place, Hybrid mode's snapshot in
    (and the rewrite that takes the model's out of the answer); as it came when neither applies."""
    services, scope, headers = arrival.services, arrival.scope, arrival.client_headers
    if scope is not None:
        answer[pcp.MEMORY] = scope.name
    reading = arrival.counted.reading
    body = await services.components.passthrough(headers, lambda: arrival.namespace, reading, arrival.forwarded, answer)
    hybrid = services.hybrid
    turn = hybrid.begin(headers, arrival.namespace, scope.key if scope is not None else None) if hybrid.in_mode(headers) else None
    if turn is not None:
        body = await turn.passthrough(reading, body, answer)
    return body, turn


@route("/messages/count_tokens", http_method=METHODS, status_code=200)
async def count_tokens(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """Anthropic's token count, of what the proxy would send. A request it would page counts what one worker call
    carries at most (the head whole and the budget): a coding agent that measures its context by it is not pushed
    into compacting what the proxy pages. One it would forward is counted by the upstream, or by the proxy
    (tiktoken) where the upstream has no count of its own (a chat-only upstream)."""
    if request.method != "POST":
        return await forwarded(request, services)
    headers = upstream_headers(services.settings, request.headers, anthropic=True)
    body = await request.body()
    counted = await read_large(body, lambda: read_api(MESSAGES, body, services))
    tokens, carried = counted.tokens, counted.carried
    decision = Arrival(services, MESSAGES, request.headers, headers, body, counted).decided(measured=False)
    if isinstance(decision, Protocol):
        return _count(min(tokens, carried + decision.policy.rounds.budget), "protocol")
    upstream = services.upstream_of(MESSAGES)
    translation = services.translation_of(MESSAGES)
    if translation.mode != "always" and "/messages" not in translation.lacking:
        target = upstream_target(request.scope)
        response = await forward(upstream, request, "POST", target, body, headers, PASSTHROUGH, stream=False, failure=MESSAGES.failure)
        if response.status_code not in (404, 405):
            return response
    return _count(tokens, "passthrough")


def _count(tokens: int, mode: str) -> Response[Any]:
    """Anthropic's token count answer, with the mode it was counted in."""
    return Response({"input_tokens": tokens}, status_code=200, headers={pcp.MODE: mode, pcp.PROMPT_TOKENS: str(tokens)})


@route("/{path:path}", http_method=METHODS, status_code=200)
async def forward_v1(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """Any other /v1 path: forwarded as it came."""
    return await forwarded(request, services)


async def forwarded(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[Any]:
    """Any /v1 call the proxy does not page, forwarded as it came: the path, the query, the headers, the body
    (to Anthropic's upstream, when it has one, for a client of Anthropic's API)."""
    started = perf_counter()
    anthropic = speaks_anthropic(request)
    headers = upstream_headers(services.settings, request.headers, anthropic)
    target = upstream_target(request.scope)
    # A body only where the client sent one (an empty POST says so with its content-length: 0).
    sent = "content-length" in request.headers or "transfer-encoding" in request.headers
    body = await request.body() if sent else None
    services.metrics.inc("pcp_requests_total", mode="passthrough")
    api = MESSAGES if anthropic else CHAT
    response = await forward(services.upstream_of(api), request, request.method, target, body, headers, PASSTHROUGH, stream=None, failure=api.failure)
    services.metrics.observe("pcp_request_seconds", perf_counter() - started, mode="passthrough")
    return response


@route(["/", "/{path:path}"], http_method=METHODS)
async def reserved(request: Request[Any, Any, Any]) -> Response[Any]:
    """Reserved for the proxy's own API (sessions, memory): never forwarded."""
    raise not_the_proxys(request.url.path)


@get("/healthz")
async def healthz(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[dict[str, Any]]:
    """Liveness for anyone, and the embedded model's: ``busy`` while requests wait for its slots, a 503 once it is
    down; what the proxy fronts only for a proxy key, when it has keys."""
    local = await services.local_model.health() if services.local_model is not None else None
    status = "unavailable" if local is not None and local["status"] == "down" else local["status"] if local is not None else "ok"
    health: dict[str, Any] = {"status": status}
    if shows_details(services.settings, request.headers):
        health["upstream"] = services.upstream.shown_url
        health["apis"] = services.translation.fronts()  # native, or translated to chat completions, and why
        if local is not None:
            health["local_model"] = local
    return Response(health, status_code=503 if status == "unavailable" else 200)


@route("/", http_method=[HttpMethod.GET, HttpMethod.HEAD])
async def root() -> Response[bytes]:
    """The root: a client's connectivity probe (Claude Code's ``HEAD /``) finds a server that answers."""
    return Response(b'{"status": "ok"}', media_type="application/json")


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> str:
    """Prometheus' exposition, behind the metrics key."""
    check_metrics_key(services.settings, request.headers)
    return services.metrics.exposition()


API_ROUTES = [chat_completions, responses, responses_compact, messages, count_tokens, forward_v1]  # under /v1
RESERVED = reserved  # under /v1/pcp, beside the own API's routes
OPEN_ROUTES = [root, healthz, metrics]  # at the root, without a proxy key
