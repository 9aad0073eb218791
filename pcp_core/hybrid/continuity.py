"""Which session's snapshot a request continues, when the client names none; and the workspace it names.

Below the threshold the proxy keeps no pages, so it recognises a
conversation by the hash chain of its messages (``chain_links``): after each
round the session is known by the link of the conversation as the request
sent it, and the next request continues it if it holds those messages before
its own latest assistant answer. The answer itself is not hashed: what a
client sends back of it (the text the proxy let through, maybe with fields
its SDK adds) is the client's to shape.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

__all__ = ["continued_links", "normal_workspace"]

# How far back a request looks for the round it continues: past a few answers the session
# did not see (a request in which the mode was disabled, or one that failed).
LOOK_BACK = 8


def continued_links(messages: Sequence[Mapping[str, Any]], links: Sequence[str], most: int = LOOK_BACK) -> list[str]:
    """The links under which the round this conversation continues may be known, latest first.

    ``links`` is the chain of ``messages`` (the conversation after its head):
    for each assistant message, latest first, the link of what came before it.
    """
    found = []
    for i in range(min(len(messages), len(links)) - 1, 0, -1):
        if messages[i].get("role") == "assistant":
            found.append(links[i - 1])
            if len(found) == most:
                break
    return found


def normal_workspace(text: str) -> str:
    """``x-pcp-workspace`` as ``runtime.workspace`` holds it: percent-decoded, ``/`` separated,
    ``.`` and ``..`` resolved, ending in ``/`` (the spec's ``/workspace/path/``); empty stays empty."""
    path = unquote(text.strip()).replace("\\", "/")
    if not path:
        return ""
    path = posixpath.normpath(path)
    if path.startswith("//"):  # POSIX keeps a leading "//"; a workspace is one path, not a host
        path = "/" + path.lstrip("/")
    return path if path.endswith("/") else path + "/"
