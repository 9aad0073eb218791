"""The coding agents as the end-to-end tests run them: installed by ``make agents``, offline, in a home of their own.

Each agent runs headless on the task's repo (``proxy.testing.agent_task``),
pointed at a base URL (the proxy's, or the scripted upstream's) the way a user
points it: one environment variable, or a provider entry in its config. Its
``HOME`` and XDG folders are the run's own; every setting that would reach
the internet (updates, telemetry, plugin installs, model lists) is off, so
that it reaches nothing but loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.testing.agent_task import TASK_PROMPT, TEST_CMD, check_repo, make_repo

__all__ = ["AGENTS", "AgentRun", "installed", "missing", "run_agent"]

HERE = Path(__file__).resolve().parents[2] / "agents"  # tests/agents: package.json, the lock, requirements-aider.txt
BIN = HERE / "node_modules" / ".bin"
BINARIES = {"claude": BIN / "claude", "codex": BIN / "codex", "opencode": BIN / "opencode", "aider": HERE / "aider-venv" / "bin" / "aider"}
AGENTS = tuple(BINARIES)
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "TERM": "dumb", "LANG": "C.UTF-8", "NO_COLOR": "1"}
FORCE = "x-pcp-mode-request"  # proxy.headers.MODE_REQUEST: protocol mode whatever the request's size


def installed(agent: str) -> bool:
    return os.access(BINARIES[agent], os.X_OK)


def missing(agent: str) -> str:
    return f"{agent} is not installed at {BINARIES[agent]}: run `make agents` (npm and PyPI are needed once, never at test time)"


@dataclass
class AgentRun:
    agent: str
    returncode: int | str
    seconds: float
    stdout: str
    stderr: str
    repo: Path
    outcome: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """The agent exited 0, the file is fixed and the tests pass (and, but for aider, it said so)."""
        said = self.agent == "aider" or "TASK-DONE" in self.stdout
        return self.returncode == 0 and bool(self.outcome.get("fixed")) and bool(self.outcome.get("tests_pass")) and said

    def summary(self) -> str:
        return f"{self.agent}: exit {self.returncode} in {self.seconds:.1f} s, {self.outcome}; stdout …{self.stdout[-1500:]!r}; stderr …{self.stderr[-1500:]!r}"


def agent_env(run: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment an agent runs in under ``run``: its own home, and ``env``."""
    home = run / "home"
    return {**BASE_ENV, "HOME": str(home), **{f"XDG_{k}_HOME": str(home / v) for k, v in XDG.items()}, **env}


def run_agent(agent: str, base_url: str, run: Path, *, force: bool = False, timeout: float = 240, stdin: str | None = None, parts: int = 0) -> AgentRun:
    """``agent`` through the whole task in a fresh repo under ``run``, at ``base_url`` (``http://host:port``, no ``/v1``).
    ``force``: it sends ``x-pcp-mode-request: force`` on every call. ``stdin``: piped to it after the task (Claude
    Code's ``-p`` and Codex's ``exec -`` read it). ``parts``: the longer task's (``agent_task.decide``)."""
    repo, home = run / "repo", run / "home"
    home.mkdir(parents=True, exist_ok=True)
    make_repo(str(repo), parts)
    command, env = COMMANDS[agent](base_url, run, repo, home, force)
    if stdin is not None and agent == "codex":  # the prompt from stdin: the task, then what is piped
        command, stdin = [*command[:-1], "-"], f"{TASK_PROMPT}\n\n{stdin}"
    env = agent_env(run, env)
    started = time.monotonic()
    try:
        piped: dict[str, Any] = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, errors="replace", timeout=timeout, **piped)
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as late:
        returncode, stdout, stderr = "timeout", _text(late.stdout), _text(late.stderr)
    outcome = check_repo(str(repo))
    return AgentRun(agent, returncode, time.monotonic() - started, stdout, stderr, repo, outcome)


XDG = {"CONFIG": ".config", "DATA": ".local/share", "CACHE": ".cache", "STATE": ".local/state"}


def _text(data: Any) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _claude(base: str, run: Path, repo: Path, home: Path, force: bool) -> tuple[list[str], dict[str, str]]:
    env = {
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no update checks, no telemetry, no title requests: loopback only
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "IS_SANDBOX": "1",  # --dangerously-skip-permissions is refused to root otherwise
        **({"ANTHROPIC_CUSTOM_HEADERS": f"{FORCE}: force"} if force else {}),
    }
    command = [str(BINARIES["claude"]), "-p", TASK_PROMPT, "--dangerously-skip-permissions", "--output-format", "stream-json", "--verbose", "--max-turns", "25"]
    return command, env


CODEX_CONFIG = """model = "gpt-5.5"
model_provider = "proxy"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false
remote_plugin = false
apps = false
tool_suggest = false
in_app_updates = false
workspace_dependencies = false
skill_mcp_dependency_install = false

[model_providers.proxy]
name = "proxy"
base_url = "{base}/v1"
env_key = "PROXY_API_KEY"
wire_api = "responses"
supports_websockets = {websockets}
{headers}
"""


def _codex(base: str, run: Path, repo: Path, home: Path, force: bool) -> tuple[list[str], dict[str, str]]:
    codex_home = run / "codex-home"  # not under /tmp's root: Codex puts helpers on its PATH from here
    codex_home.mkdir(exist_ok=True)
    headers = f'http_headers = {{ "{FORCE}" = "force" }}' if force else ""
    websockets = "true" if os.environ.get("PCP_TEST_CODEX_WEBSOCKETS") else "false"
    config = CODEX_CONFIG.format(base=base, headers=headers, websockets=websockets)
    limit = os.environ.get("PCP_TEST_CODEX_COMPACT_AT")  # Codex compacts its history past this many tokens of its own count
    (codex_home / "config.toml").write_text(f"model_auto_compact_token_limit = {limit}\n" + config if limit else config)
    command = [str(BINARIES["codex"]), "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-C", str(repo), TASK_PROMPT]
    return command, {"CODEX_HOME": str(codex_home), "PROXY_API_KEY": "sk-test"}


def _opencode(base: str, run: Path, repo: Path, home: Path, force: bool) -> tuple[list[str], dict[str, str]]:
    options: dict[str, Any] = {"baseURL": f"{base}/v1", "apiKey": "sk-test", **({"headers": {FORCE: "force"}} if force else {})}
    config = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": "proxy/scripted-model",
        "small_model": "proxy/scripted-model",
        "provider": {
            "proxy": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "proxy",
                "options": options,
                "models": {"scripted-model": {"name": "scripted-model", "tool_call": True}},
            }
        },
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        "agent": {"build": {"steps": 15}},
    }
    path = run / "opencode.json"
    path.write_text(json.dumps(config, indent=2))
    env = {
        "OPENCODE_CONFIG": str(path),
        **{
            f"OPENCODE_DISABLE_{name}": "1"
            for name in ("AUTOUPDATE", "SHARE", "LSP_DOWNLOAD", "MODELS_FETCH", "DEFAULT_PLUGINS", "CLAUDE_CODE", "TERMINAL_TITLE")
        },
        # opencode installs its plugin package into each config folder in the background (bun add):
        # a registry on a closed loopback port makes that fail at once instead of going out.
        "NPM_CONFIG_REGISTRY": "http://127.0.0.1:9/",
        "npm_config_registry": "http://127.0.0.1:9/",
    }
    return [str(BINARIES["opencode"]), "run", "--pure", "--print-logs", "--format", "json", TASK_PROMPT], env


def _aider(base: str, run: Path, repo: Path, home: Path, force: bool) -> tuple[list[str], dict[str, str]]:
    # aider looks its model up in litellm's price list, fetched from the internet unless the model is
    # in --model-metadata-file and the cached copy is there: both are given.
    meta = {
        "openai/scripted-model": {
            "max_input_tokens": 128000,
            "max_tokens": 8192,
            "max_output_tokens": 8192,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    }
    caches = home / ".aider" / "caches"
    caches.mkdir(parents=True, exist_ok=True)
    (caches / "model_prices_and_context_window.json").write_text(json.dumps(meta))
    (run / "aider-model-metadata.json").write_text(json.dumps(meta))
    settings = [
        {
            "name": "openai/scripted-model",
            "edit_format": "diff",
            "use_repo_map": False,
            **({"extra_params": {"extra_headers": {FORCE: "force"}}} if force else {}),
        }
    ]
    (run / "aider-model-settings.yml").write_text(json.dumps(settings))  # JSON is YAML
    (home / ".gitconfig").write_text("[user]\n\tname = task\n\temail = task@example.invalid\n")
    env = {
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_API_BASE": f"{base}/v1",
        "AIDER_ANALYTICS": "false",
        "AIDER_CHECK_UPDATE": "false",
        "HF_HUB_OFFLINE": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    command = [
        str(BINARIES["aider"]), "--model", "openai/scripted-model", "--openai-api-base", f"{base}/v1", "--openai-api-key", "sk-test",
        "--model-metadata-file", str(run / "aider-model-metadata.json"), "--model-settings-file", str(run / "aider-model-settings.yml"),
        "--edit-format", "diff", "--message", TASK_PROMPT, "--yes-always", "--no-pretty", "--stream", "--no-analytics", "--no-check-update",
        "--no-show-release-notes", "--no-show-model-warnings", "--auto-test", "--test-cmd", TEST_CMD, "--map-tokens", "0", "--no-gitignore",
        "--no-fancy-input", "--encoding", "utf-8",
    ]  # fmt: skip
    return command, env


COMMANDS = {"claude": _claude, "codex": _codex, "opencode": _opencode, "aider": _aider}
