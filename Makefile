# Quickstart: `make run` serves the proxy on the embedded local model; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# llama.cpp compiles from source on first install (several minutes on 2 cores).
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install --quiet -c constraints.txt -e '.[local,embeddings,dev]'
	touch $(STAMP)

install: $(STAMP)

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
