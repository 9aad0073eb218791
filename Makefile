# Quickstart: `make run` serves the proxy on the embedded local model; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: install run test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# llama.cpp compiles from source on first install (several minutes on 2 cores), for the
	# instruction sets named here rather than the build machine's own: with -march=native it
	# uses AMX tiles where the CPU lists them, and a VM that does not enable them faults.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install --quiet -c constraints.txt -e '.[local,embeddings,memory,redis,dev]'
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
