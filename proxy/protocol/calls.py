"""The calls a protocol-mode request makes upstream: the worker's (whole, or as a stream) and the router's.

Each goes to the upstream of the request's API, in that API's body (the
request's codec), with the request's headers (``x-pcp-role`` names the call)
and under its deadline; each counts in ``pcp_upstream_calls_total`` and adds
its usage to the request's (a worker call's from its ``Usage.mark``: the client reads the answering call's).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from pcp_core import CallRouter, CallWorker

from .. import headers as pcp
from ..apis.codec import Usage
from ..errors import PcpError, UpstreamError
from ..upstream import passed_back

if TYPE_CHECKING:
    from ..apis.codec import Codec
    from ..services import Services
    from ..upstream import Upstream
    from .hooks import Hook

__all__ = ["UpstreamCalls"]

# A router model reranks; it is worth waiting for briefly, never for a whole generation.
ROUTER_TIMEOUT = 10.0
ROUTER_MAX_TOKENS = 80

log = logging.getLogger("pcp.drive")


class UpstreamCalls:
    """One request's calls upstream; ``answered`` holds the headers of the latest worker call's answer."""

    def __init__(self, services: Services, codec: Codec, headers: dict[str, str], deadline: float, hooks: Sequence[Hook] = ()):
        self.services = services
        self.codec = codec
        self.upstream: Upstream = services.upstream_of(codec.api)
        self.headers = headers
        self.deadline = deadline
        self.hooks = hooks  # the request's extensions: Hybrid mode reads its context section out of every worker answer
        self.usage = Usage()
        self.answered: dict[str, str] = {}

    async def worker(self, call: CallWorker) -> dict[str, Any]:
        """A worker call's whole answer."""
        self.services.metrics.inc("pcp_upstream_calls_total", role="worker")
        codec = self.codec
        self.usage.mark()
        data, self.answered = await self.upstream.complete(
            codec.api.path, codec.worker_body(call, stream=False), self.headers, codec.check, deadline=self.deadline
        )
        codec.usage(self.usage, data)
        for hook in self.hooks:
            hook.answered(data)
        return data

    async def worker_stream(self, call: CallWorker) -> AsyncIterator[dict[str, Any]]:
        """A worker call's answer as the upstream's events; a refusal raises before the first."""
        upstream, codec = self.upstream, self.codec
        self.services.metrics.inc("pcp_upstream_calls_total", role="worker")
        self.usage.mark()
        response = await upstream.open("POST", codec.api.path, content=codec.worker_body(call, stream=True), headers=self.headers, deadline=self.deadline)
        if response.status_code >= 400:
            raise UpstreamError.refused(
                response.status_code, await upstream.read(response), response.headers.get("content-type"), response.headers.get("retry-after")
            )
        self.answered = passed_back(response.headers)
        events = upstream.sse_events(response, codec.rules())
        for hook in self.hooks:
            events = hook.streamed(events)
        return events

    async def router(self, call: CallRouter, role: str = "router") -> str | None:
        """The router model's reply, or None: addressing works without it, so its failure fails nothing."""
        model = self.services.settings.router_model
        self.services.metrics.inc("pcp_upstream_calls_total", role=role)
        codec = self.codec
        body = codec.router_body(call.messages, model, ROUTER_MAX_TOKENS)
        try:
            data, _ = await self.upstream.complete(
                codec.api.path, body, {**self.headers, pcp.ROLE: role}, codec.check, timeout=ROUTER_TIMEOUT, deadline=self.deadline
            )
        except PcpError as error:
            log.warning("router model %s gave no ranking (status %s): %s", model, error.status, error)
            return None
        codec.usage(self.usage, data)
        return codec.reply(data).text
