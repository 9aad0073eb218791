"""The inspector: a page at ``/inspect`` that shows a caller what the proxy did with its conversations.

No build step and nothing from elsewhere: one HTML file, one script and one
stylesheet, served by the proxy from ``static/`` beside this file; the data
comes from the proxy's own API (``api.py``), with the key the person types
in (kept in the tab's ``sessionStorage``). The page itself holds no data, so
it is served without a key; its Content-Security-Policy lets it load only
the proxy's own files and talk only to the proxy.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from typing import Any

from litestar import Request, Response, get

from .api import INSPECTOR_API

__all__ = ["INSPECTOR_API", "INSPECTOR_PAGES"]

# Litestar names the charset of a text/* type itself (utf-8): named here too, it was sent twice.
ASSETS = {"inspect.js": "text/javascript", "inspect.css": "text/css"}
SECURITY = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


@lru_cache(maxsize=len(ASSETS) + 1)
def _asset(name: str) -> bytes:
    """A file of the inspector's static assets."""
    return files(__package__).joinpath("static", name).read_bytes()


@get("/inspect")
async def inspector_page() -> Response[bytes]:
    """``GET /inspect``: the inspector's page."""
    return Response(_asset("index.html"), media_type="text/html", headers=SECURITY)


@get("/inspect/{name:str}")
async def inspector_asset(request: Request[Any, Any, Any]) -> Response[bytes]:
    """``GET /inspect/{name}``: one of the inspector's assets, only those named."""
    name = request.path_params["name"]
    media_type = ASSETS.get(name)
    if media_type is None:  # only the files named above: no path reaches the disk
        return Response(b"not found", status_code=404, media_type="text/plain", headers=SECURITY)
    return Response(_asset(name), media_type=media_type, headers=SECURITY)


INSPECTOR_PAGES = [inspector_page, inspector_asset]  # at the root, without a key; their data is INSPECTOR_API's, under /v1/pcp
