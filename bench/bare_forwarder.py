"""Reference point: the barest useful ASGI forwarder on httpx (what any proxy must at least cost)."""

import os

import httpx

UPSTREAM = os.environ["UPSTREAM"]
client = httpx.AsyncClient(base_url=UPSTREAM, limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"host", b"content-length")]
    response = await client.request(scope["method"], scope["path"].removeprefix("/v1"), content=body, headers=headers)
    out = [(k.encode(), v.encode()) for k, v in response.headers.items() if k not in ("date", "server")]
    await send({"type": "http.response.start", "status": response.status_code, "headers": out})
    await send({"type": "http.response.body", "body": response.content})
