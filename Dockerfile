# pcp-proxy with the embedded local model. Point it elsewhere with PCP_UPSTREAM_BASE_URL.
FROM python:3.11-slim

# llama-cpp-python (the `local` extra) compiles llama.cpp at install time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY proxy ./proxy
COPY pcp_core ./pcp_core
COPY config ./config
# torch (for the `embeddings` extra) from its CPU index: PyPI's build carries CUDA.
# llama.cpp for named instruction sets, not the build machine's (see the Makefile).
RUN CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" pip install --no-cache-dir -c constraints.txt \
      --extra-index-url https://download.pytorch.org/whl/cpu '.[local,embeddings,encryption,memory,redis]'

ENV PCP_HOST=0.0.0.0 \
    PCP_PORT=8000 \
    PCP_DATA_DIR=/data
VOLUME /data
EXPOSE 8000
CMD ["pcp-proxy", "serve", "--config", "/app/config/default.toml"]
