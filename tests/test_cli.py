"""`pcp-proxy serve` as a user runs it: a real process."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _clean_env(tmp_path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PCP_")}
    return {**env, "PCP_DATA_DIR": str(tmp_path), **extra}


@pytest.mark.parametrize("command", [["pcp-proxy"], [sys.executable, "-m", "proxy"]], ids=["script", "module"])
def test_serve_fronts_the_upstream(command, served_upstream, tmp_path):
    if command[0] == "pcp-proxy":
        # The console script is installed beside the interpreter running the tests.
        script = Path(sys.executable).parent / "pcp-proxy"
        command = [str(script) if script.exists() else shutil.which("pcp-proxy") or pytest.fail("console script pcp-proxy is not installed")]
    port = _free_port()
    process = subprocess.Popen([*command, "serve", "--upstream", served_upstream.url, "--port", str(port)], env=_clean_env(tmp_path, PCP_ROUTER_EMBEDDINGS="false"))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, "pcp-proxy exited during start-up"
            assert time.monotonic() < deadline, "pcp-proxy did not become healthy"
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0)
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content == "ok"
        assert served_upstream.requests[-1].headers["authorization"] == "Bearer sk-x"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0


def test_bad_setting_stops_start_up_with_its_name(tmp_path):
    result = subprocess.run([sys.executable, "-m", "proxy", "serve"], env=_clean_env(tmp_path, PCP_SENTRY_THRESHOLD="lots"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "PCP_SENTRY_THRESHOLD" in result.stderr
    assert "Traceback" not in result.stderr
