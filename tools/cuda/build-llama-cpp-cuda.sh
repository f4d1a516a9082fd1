#!/usr/bin/env bash
# Builds issue 6's GPU peer: llama.cpp with its CUDA backend, from the same
# pinned source as the CPU peer (`tools/peers/install-llama-cpp.sh
# --source-only` fetches and unpacks the llama-cpp-python sdist, without
# building the CPU peer). It compiles wherever nvcc exists; no GPU is needed
# to build, so the slow compile (about 40 minutes on the 2-core dev machine,
# session 34) can run there and the binary travels to the GPU machine,
# xz-compressed (about 41 MB; see tools/cuda/bench.sh, RUNS=llamacpp).
#   ${FERRY_CACHE:-~/.cache/ferry}/peers/llama.cpp-<pin>/{build-cuda,bin-cuda}
# Only sm_90a (H200) is built: one architecture keeps the binaries small.
# Prints the bin directory on stdout; progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
PIN=0.3.36
ROOT="${FERRY_CACHE:-$HOME/.cache/ferry}/peers/llama.cpp-$PIN"
BIN="$ROOT/bin-cuda"
ARCH="${FERRY_PEER_CUDA_ARCH:-90a}"
JOBS="${FERRY_PEER_JOBS:-$(nproc)}"
TARGETS=(llama-batched-bench llama-bench)
if [[ -f "$BIN/.done" ]]; then echo "$BIN"; exit 0; fi
src=$("$here/tools/peers/install-llama-cpp.sh" --source-only)
export PATH="/usr/local/cuda/bin:$PATH"
echo "peers: building llama.cpp (CUDA, sm_$ARCH) from llama-cpp-python==$PIN (-j$JOBS)" >&2
cmake -S "$src" -B "$ROOT/build-cuda" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF >&2
cmake --build "$ROOT/build-cuda" -j"$JOBS" --target "${TARGETS[@]}" >&2
mkdir -p "$BIN"
for t in "${TARGETS[@]}"; do
  cp -f "$ROOT/build-cuda/bin/$t" "$BIN/"
  strip "$BIN/$t"
done
echo "llama-cpp-python==$PIN cuda sm_$ARCH" >"$BIN/.done"
echo "$BIN"
