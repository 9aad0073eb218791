from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from proxy.app import create_app
from proxy.settings import Settings
from proxy.testing import FakeUpstream, serve_in_thread


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        yield fake


class RunningProxy:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.server = serve_in_thread(create_app(settings))
        self.url = self.server.url

    def client(self, api_key: str = "sk-client", **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=30, **kwargs)


@pytest.fixture
def start_proxy(upstream: FakeUpstream, tmp_path) -> Iterator[Callable[..., RunningProxy]]:
    """Start a real proxy (uvicorn, loopback) in front of the fake upstream."""
    running: list[RunningProxy] = []

    def start(**overrides: Any) -> RunningProxy:
        # Embeddings load a model per proxy: on only where a test asks for them.
        fields = {"upstream_base_url": upstream.url, "data_dir": str(tmp_path / "data"), "router_embeddings": False, **overrides}
        proxy = RunningProxy(Settings(**fields))
        running.append(proxy)
        return proxy

    yield start
    for proxy in running:
        proxy.server.stop()


@pytest.fixture
def proxy(start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return start_proxy()
