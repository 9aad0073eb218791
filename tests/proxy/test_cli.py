"""`pcp-proxy serve` as a user runs it: a real process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.proxy.helpers import free_port
from tests.proxy.serving import wait_healthy


def _clean_env(tmp_path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PCP_")}
    return {**env, "PCP_DATA_DIR": str(tmp_path), **extra}


@pytest.mark.parametrize("command", [["pcp-proxy"], [sys.executable, "-m", "proxy"]], ids=["script", "module"])
def test_serve_fronts_the_upstream(command, served_upstream, tmp_path):
    if command[0] == "pcp-proxy":
        # The console script is installed beside the interpreter running the tests.
        script = Path(sys.executable).parent / "pcp-proxy"
        command = [str(script) if script.exists() else shutil.which("pcp-proxy") or pytest.fail("console script pcp-proxy is not installed")]
    port = free_port()
    process = subprocess.Popen(
        [*command, "serve", "--upstream", served_upstream.url, "--port", str(port)], env=_clean_env(tmp_path, PCP_ROUTER_EMBEDDINGS="false")
    )
    try:
        wait_healthy(process, port)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-x", max_retries=0)
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content == "ok"
        assert served_upstream.requests[-1].headers["authorization"] == "Bearer sk-x"
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0


def test_bad_setting_stops_start_up_with_its_name(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve"], env=_clean_env(tmp_path, PCP_SENTRY_THRESHOLD="lots"), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "PCP_SENTRY_THRESHOLD" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_json_logs_writes_json_lines_with_the_trace(served_upstream, tmp_path):
    """PCP_LOG_FORMAT=json: every line on stderr is one JSON object, uvicorn's too; a protocol-mode request's carry its trace."""
    from proxy.testing.upstream import completion
    from tests.proxy.telemetry_helpers import dated_chat

    port = free_port()
    env = _clean_env(tmp_path, PCP_LOG_FORMAT="json", PCP_ROUTER_EMBEDDINGS="false", PCP_SENTRY_THRESHOLD="500", PCP_CONTEXT_BUDGET="1024")
    served_upstream.enqueue(completion("5521"))
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--upstream", served_upstream.url, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_healthy(process, port)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "m", "messages": dated_chat()},
            headers={"authorization": "Bearer sk-x"},
            timeout=30,
        )
        assert response.headers["x-pcp-mode"] == "protocol"
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=15)
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    ended = [line for line in lines if line.get("trace") == response.headers["x-pcp-trace"]]
    assert ended and ended[-1]["logger"] == "pcp.requests" and ended[-1]["tokens_saved"] == int(response.headers["x-pcp-tokens-saved"])
