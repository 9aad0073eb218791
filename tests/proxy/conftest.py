from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from litestar.testing import TestClient

from proxy.app import create_app
from proxy.cli.server import server_options
from proxy.settings import Settings
from proxy.testing.upstream import FakeUpstream, serve_in_thread
from proxy.tokenizer import Tokenizer
from tests.proxy.helpers import BUDGET

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled model is on disk; nothing is fetched


@pytest.fixture
def upstream() -> FakeUpstream:
    """The scripted upstream, in process: the proxy reaches it through its transport, not a socket."""
    return FakeUpstream()


@pytest.fixture
def served_upstream() -> Iterator[FakeUpstream]:
    """The scripted upstream on loopback, for what reaches it over the network (another process)."""
    with FakeUpstream() as fake:
        yield fake


class RunningProxy:
    """A proxy under test: in process (Litestar's test client) or, with ``sockets``, uvicorn on loopback.

    ``http`` is an httpx client at its root; ``client()`` the openai SDK pointed at it.
    """

    def __init__(self, settings: Settings, upstream: FakeUpstream | None, sockets: bool = False, embedder: Any = None, tokenizer: Tokenizer | None = None):
        self.settings = settings
        app = create_app(settings, transport=upstream.transport() if upstream is not None else None, embedder=embedder, tokenizer=tokenizer)
        self.app = app
        if sockets:
            self.server = serve_in_thread(app, **server_options(settings))
            self.url = self.server.url
            self.http: httpx.Client = httpx.Client(base_url=self.url, timeout=30)
        else:
            self.server = None
            self.url = "http://proxy.test"
            self.http = TestClient(app, base_url=self.url, raise_server_exceptions=False, timeout=30)
            self.http.__enter__()  # the app's lifespan starts
        self.stopped = False

    @property
    def services(self) -> Any:
        """The running proxy's services (``proxy.services.Services``), opened by its lifespan."""
        return self.app.state.services

    def client(self, api_key: str = "sk-client", **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=30, http_client=self.http, **kwargs)

    def anthropic(self, api_key: str = "sk-ant-client", **kwargs: Any) -> anthropic.Anthropic:
        """The anthropic SDK pointed at the proxy. It speaks httpx2, which cannot take ``http``: a
        transport hands each of its requests to ``http`` and its answer back."""
        return anthropic.Anthropic(
            base_url=self.url, api_key=api_key, max_retries=0, timeout=30, http_client=httpx2.Client(transport=httpx2.MockTransport(self._bridged)), **kwargs
        )

    def _bridged(self, request: httpx2.Request) -> httpx2.Response:
        answer = self.http.request(request.method, str(request.url), headers=list(request.headers.multi_items()), content=request.read())
        headers = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")]
        return httpx2.Response(answer.status_code, headers=headers, content=answer.content)

    def stop(self) -> None:
        """Stop the proxy, its lifespan ending: every session write is finished and the store closed."""
        if self.stopped:
            return
        self.stopped = True
        if self.server is not None:
            self.http.close()
            self.server.stop()
        else:
            self.http.__exit__(None, None, None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With ``PROXY_TEST_STORE=redis``, the tests that read the embedded store's files have nothing to read."""
    if os.environ.get("PROXY_TEST_STORE") == "redis":
        skip = pytest.mark.skip(reason="reads the embedded store's files; the proxies here keep them in Redis")
        for item in items:
            if "embedded_store" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def start_proxy(upstream: FakeUpstream, tmp_path) -> Iterator[Callable[..., RunningProxy]]:
    """Start a proxy in front of the fake upstream (``sockets=True``: a real server on loopback).

    An ``upstream_base_url`` of the test's own is reached over the network, not the fake;
    ``embedder`` and ``tokenizer`` stand in for the settings' (``create_app``).
    """
    running: list[RunningProxy] = []
    servers: list[Any] = []

    def start(sockets: bool = False, embedder: Any = None, tokenizer: Tokenizer | None = None, **overrides: Any) -> RunningProxy:
        # Embeddings load a model per proxy: on only where a test asks for them.
        fields = {"upstream_base_url": upstream.url, "data_dir": str(tmp_path / "data"), "router_embeddings": False, **overrides}
        if os.environ.get("PROXY_TEST_STORE") == "redis" and "store" not in overrides:  # the same tests, on a real Redis
            fields["store"] = _test_redis(tmp_path, servers).url
        fake = upstream if fields["upstream_base_url"] == upstream.url else None
        proxy = RunningProxy(Settings(**fields), fake, sockets=sockets, embedder=embedder, tokenizer=tokenizer)
        running.append(proxy)
        return proxy

    yield start
    for proxy in running:
        proxy.stop()
    for server in servers:
        server.stop()


def _test_redis(tmp_path, servers: list[Any]) -> Any:
    """The test's Redis (one per test, shared by its proxies), for ``PROXY_TEST_STORE=redis``."""
    if not servers:
        from tests.proxy.redis_server import RedisServer

        directory = tmp_path / "redis"
        directory.mkdir(exist_ok=True)
        servers.append(RedisServer(directory))
    return servers[0]


@pytest.fixture
def proxy(start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return start_proxy()


# The protocol-mode proxy: it pages a request over 500 tokens into a budget of ``BUDGET``, in four rounds at most.
PROTOCOL = {"sentry_threshold": 500, "context_budget": BUDGET, "max_rounds": 4}


@pytest.fixture
def protocol_proxy(start_proxy: Callable[..., RunningProxy], request: pytest.FixtureRequest) -> RunningProxy:
    """A proxy in protocol mode (``PROTOCOL``); a module's ``pytest.mark.protocol(setting=value, …)`` sets its own settings."""
    marker = request.node.get_closest_marker("protocol")
    return start_proxy(**{**PROTOCOL, **(marker.kwargs if marker is not None else {})})


@pytest.fixture
def redis_server(tmp_path) -> Iterator[Any]:
    """A real redis-server of its own (tests/redis_server.py), stopped after the test; skipped only when it cannot start."""
    pytest.importorskip("redis", reason="the redis client is not installed (the `redis` extra)")
    from tests.proxy.redis_server import RedisServer

    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory)
    yield server
    server.stop()
