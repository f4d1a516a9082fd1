#!/usr/bin/env bash
# Installs the llama.cpp peer for issue 5's benchmarks: the PyPI sdist of
# llama-cpp-python (pinned) carries llama.cpp's source under vendor/llama.cpp;
# this builds its CPU tools (Release, GGML_NATIVE=ON) into the cache:
#   ${FERRY_CACHE:-~/.cache/ferry}/peers/llama.cpp-<pin>/{src,build,bin}
# Idempotent: a finished install (bin/.done) is only re-printed.
# Prints the bin directory on stdout; progress goes to stderr.
# FERRY_PEER_JOBS sets the build's parallelism (default: nproc).
#   install-llama-cpp.sh --source-only   only fetches and unpacks the source
#                                        (for tools/cuda/build-llama-cpp-cuda.sh);
#                                        prints the source directory
set -euo pipefail
source_only=0
case "${1:-}" in
  --source-only) source_only=1 ;;
  "") ;;
  *) echo "install-llama-cpp.sh: unknown argument '$1' (only --source-only)" >&2; exit 2 ;;
esac
PIN=0.3.36   # newest llama-cpp-python on PyPI with an sdist (checked 2025-11)
ROOT="${FERRY_CACHE:-$HOME/.cache/ferry}/peers/llama.cpp-$PIN"
BIN="$ROOT/bin"
TARGETS=(llama-server llama-bench llama-batched-bench llama-quantize llama-simple llama-cli llama-tokenize)
JOBS="${FERRY_PEER_JOBS:-$(nproc)}"

# What a finished install records: a different stamp (an older install,
# or one built with other flags) is rebuilt.
STAMP="llama-cpp-python==$PIN, ggml AMX off"
if [[ $source_only == 0 && -f "$BIN/.done" && "$(cat "$BIN/.done")" == "$STAMP" ]]; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$ROOT"

# 1. Source: the sdist, unpacked once (src/ is llama.cpp's tree).
if [[ ! -f "$ROOT/src/CMakeLists.txt" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "peers: downloading llama-cpp-python==$PIN (sdist) from PyPI" >&2
  # (pip prepares the sdist's metadata, fetching its build backend: ~1 min)
  python3 -m pip download --quiet --no-deps --no-binary :all: \
    --disable-pip-version-check "llama-cpp-python==$PIN" -d "$tmp" >&2
  tar -xzf "$tmp/llama_cpp_python-$PIN.tar.gz" -C "$tmp"
  rm -rf "$ROOT/src"
  mv "$tmp/llama_cpp_python-$PIN/vendor/llama.cpp" "$ROOT/src"
fi
if [[ $source_only == 1 ]]; then
  echo "$ROOT/src"
  exit 0
fi

# 2. Build. CPU only; no web UI download, no TLS, no tests or examples we
# do not use. The git-less tree gets a build number of 0; the pin names it.
# ggml's AMX kernels are compiled out (-U__AMX_INT8__; a no-op on CPUs
# without AMX): on the 2-core Xeon with AMX that ran the 2026-12-01
# benchmarks, every prompt step of this version crashed in
# ggml_backend_amx_mul_mat (SIGSEGV, all five benchmark models; AMX itself
# works there). `--repack 0` would avoid it too, but also turns off the
# AVX-512 repacked kernels that make llama.cpp fast.
echo "peers: building llama.cpp from llama-cpp-python==$PIN (-j$JOBS; slow on 2 cores)" >&2
cmake -S "$ROOT/src" -B "$ROOT/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_OPENMP=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__ >&2
cmake --build "$ROOT/build" -j"$JOBS" --target "${TARGETS[@]}" >&2

mkdir -p "$BIN"
for t in "${TARGETS[@]}"; do
  cp -f "$ROOT/build/bin/$t" "$BIN/"
done
echo "$STAMP" >"$BIN/.done"
echo "$BIN"
