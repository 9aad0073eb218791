# pcp-proxy with the embedded local model. Point it elsewhere with PCP_UPSTREAM_BASE_URL.
FROM python:3.11-slim

# llama.cpp's llama-server, the embedded model's server, compiles from source.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY deploy/build-llama-server.sh ./deploy/
# llama.cpp for named instruction sets, not the build machine's (see the Makefile).
RUN deploy/build-llama-server.sh python /usr/local/bin/llama-server "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
# Exactly what CI tested: the lock (every package at one version, its files' hashes checked), torch's CPU
# build from its own index; then the project, built by the locked setuptools.
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes --no-deps --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.lock
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY pcp_core ./pcp_core
COPY config ./config
RUN pip install --no-cache-dir --no-deps --no-build-isolation .

ENV PCP_HOST=0.0.0.0 \
    PCP_PORT=8000 \
    PCP_DATA_DIR=/data
VOLUME /data
EXPOSE 8000
CMD ["pcp-proxy", "serve", "--config", "/app/config/default.toml"]
