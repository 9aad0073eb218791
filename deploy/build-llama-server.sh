#!/bin/sh
# llama.cpp's own llama-server, built from the llama.cpp sources that the llama-cpp-python sdist
# (the version and hash below) vendors: the newest llama.cpp the package registries carry.
#   deploy/build-llama-server.sh PYTHON DEST "CMAKE FLAGS"
# Needs cmake and a C++ compiler; takes ~14 minutes on 2 cores. The web UI is left out (its
# assets would be a download), and so are libcurl and OpenSSL: it serves the proxy on loopback.
set -eu
python=$1; dest=$2; flags=$3
# The Makefile reads the version from here (the folder the build is kept in is named for it).
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'llama-cpp-python==%s --hash=sha256:%s\n' "$version" "$sha256" >"$tmp/sdist.txt"
"$python" -m pip download --quiet --no-binary :all: --no-deps --require-hashes -r "$tmp/sdist.txt" -d "$tmp"
tar xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp"
# shellcheck disable=SC2086  # the flags are words
cmake -S "$tmp/llama_cpp_python-$version/vendor/llama.cpp" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release $flags \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$tmp/cmake.log" 2>&1 \
  || { tail -30 "$tmp/cmake.log"; exit 1; }
cmake --build "$tmp/build" --config Release --target llama-server -j"$(nproc)" >"$tmp/build.log" 2>&1 \
  || { tail -30 "$tmp/build.log"; exit 1; }
mkdir -p "$(dirname "$dest")"
install -m 755 "$tmp/build/bin/llama-server" "$dest.tmp" && mv "$dest.tmp" "$dest"
