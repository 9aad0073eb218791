"""Every ``x-pcp-*`` header name, and the one reading of the session a client pins.

Request headers speak to the proxy and never go upstream (``upstream.outgoing``);
response headers tell the client what the proxy did; ``x-pcp-role`` is the
proxy's word to its upstream on the calls it makes on its own behalf.
"""

from __future__ import annotations

from collections.abc import Mapping

from pcp_core import SESSION_ID

from .errors import ClientError

__all__ = [
    "BUDGET",
    "COMPONENTS",
    "CONSULTED",
    "CONTEXT_MODE",
    "CONTEXT_ROUND",
    "MEMORY",
    "MODE",
    "MODE_REASON",
    "MODE_REQUEST",
    "PAGES",
    "PREFIX",
    "PROMPT_TOKENS",
    "ROLE",
    "ROUNDS",
    "SESSION",
    "THRESHOLD",
    "TOKENS_SAVED",
    "TRACE",
    "WORKSPACE",
    "client_session",
    "pinned_session",
]

PREFIX = "x-pcp-"

# Sent by the client.
SESSION = "x-pcp-session"  # pins the session a request continues (also a response header)
MEMORY = "x-pcp-memory"  # the memory scope read and written (also a response header)
MODE_REQUEST = "x-pcp-mode-request"  # auto | off | force
THRESHOLD = "x-pcp-threshold"
BUDGET = "x-pcp-budget"
CONTEXT_MODE = "x-pcp-context-mode"  # Hybrid mode: enabled | disabled
WORKSPACE = "x-pcp-workspace"  # Hybrid mode's runtime.workspace

# Sent back to the client.
MODE = "x-pcp-mode"  # passthrough | protocol
MODE_REASON = "x-pcp-mode-reason"  # why: pcp_core.decision.REASONS
PROMPT_TOKENS = "x-pcp-prompt-tokens"
ROUNDS = "x-pcp-rounds"
TOKENS_SAVED = "x-pcp-tokens-saved"
PAGES = "x-pcp-pages"
CONSULTED = "x-pcp-consulted"
TRACE = "x-pcp-trace"
COMPONENTS = "x-pcp-components"
CONTEXT_ROUND = "x-pcp-context-round"

# Sent upstream on the proxy's own calls: worker, router, memory-router, summary-writer, embeddings.
ROLE = "x-pcp-role"


# Sent by coding agents: the session the agent itself is in (Claude Code's, Codex CLI's). Not the proxy's
# to read as a pin (``x-pcp-session``), but a name two agents' sessions are kept apart by (``pcp_core.client_named``).
CLIENT_SESSIONS = ("x-claude-code-session-id", "session-id")


def client_session(headers: Mapping[str, str]) -> str | None:
    """The session a coding agent names its own calls with, if it names one."""
    return next((headers[name] for name in CLIENT_SESSIONS if headers.get(name)), None)


def pinned_session(headers: Mapping[str, str]) -> str | None:
    """The session the client names in ``x-pcp-session``, if it names one."""
    pinned = headers.get(SESSION)
    if pinned is not None and not SESSION_ID.fullmatch(pinned):
        raise ClientError(f"{SESSION} must be 1 to 128 letters, digits or . _ : -", param=SESSION, code="invalid_session")
    return pinned
