"""An event stream's ``data:`` lines read one way wherever the proxy reads a stream; the translation a transport that
passes every other call through untouched."""

from __future__ import annotations

import asyncio
import json

import httpx

from proxy.apis.translation import Translation
from proxy.sse import DataLines, data_field, typed_event


def test_data_lines_come_whole_however_the_bytes_are_cut():
    stream = b'event: x\r\ndata: {"a": 1}\r\n\r\ndata: [DONE]\n\ndata: {"b": 2}'
    for cut in range(len(stream) + 1):
        lines = DataLines()
        seen = lines.feed(stream[:cut]) + lines.feed(stream[cut:])
        assert seen == [b'{"a": 1}', b"[DONE]"]
        assert lines.rest() == b'{"b": 2}'  # a last line with no line break, once the stream has ended


def test_a_line_that_is_not_data_carries_nothing():
    assert data_field(b"event: message_start") is None
    assert data_field(b": a comment") is None
    assert data_field(b"data:  {}\r") == b"{}"


def test_a_typed_event_names_its_type_twice_and_first():
    assert typed_event("message_stop") == b'event: message_stop\ndata: {"type": "message_stop"}\n\n'
    assert json.loads(typed_event("ping", n=1).split(b"data: ")[1]) == {"type": "ping", "n": 1}


class _Recording(httpx.AsyncBaseTransport):
    """A transport that answers every call 200 and keeps what it was sent."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Note the call's path; answer an empty JSON object."""
        self.paths.append(request.url.path)
        return httpx.Response(200, json={}, request=request)


def test_the_translation_passes_through_what_is_not_a_post_of_an_api_below_the_base_url():
    inner = _Recording()
    translation = Translation(inner, "http://upstream.test/v1", "always")

    async def send(method: str, url: str) -> int:
        async with httpx.AsyncClient(transport=translation) as client:
            return (await client.request(method, url, content=b"{}")).status_code

    for method, url in [
        ("GET", "http://upstream.test/v1/responses"),
        ("POST", "http://upstream.test/v1/models"),
        ("POST", "http://upstream.test/other/responses"),
    ]:
        assert asyncio.run(send(method, url)) == 200
    assert inner.paths == ["/v1/responses", "/v1/models", "/other/responses"]
