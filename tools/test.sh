#!/usr/bin/env bash
# README command 2: the whole test suite. Builds and runs it twice: an
# optimised build with warnings as errors, then an ASan+UBSan build; then
# fuzzes the GGUF reader for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/fetch-model.sh >/dev/null
jobs=$(nproc)

# Where the CUDA toolkit is installed, the release build includes the CUDA
# backend (compiled, and its no-GPU error checked; its GPU tests need a GPU:
# tools/cuda/test.sh).
cuda=()
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc ]] && cuda=(-DFERRY_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")

echo "== release build (-Werror${cuda:+, with the CUDA backend})"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DFERRY_WERROR=ON "${cuda[@]}" >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs"
if [[ -n $nvcc ]] && ! nvidia-smi >/dev/null 2>&1; then
  # No GPU here: --device cuda must fail with a message that names it.
  if msg=$(build-test/ferry run -m tests/data/models/tiny-llama-f32.gguf --device cuda x 2>&1); then
    echo "ferry run --device cuda succeeded without a GPU"; exit 1
  fi
  grep -q "\[cuda\] no CUDA device is usable" <<<"$msg" || { echo "unexpected: $msg"; exit 1; }
  echo "--device cuda without a GPU: $msg"
fi

echo "== ASan + UBSan build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_WERROR=ON \
  -DFERRY_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 FERRY_SANITIZED=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

echo "== fuzz the GGUF reader (${FERRY_FUZZ_SECONDS:-60} s)"
bash tools/fuzz-gguf.sh "${FERRY_FUZZ_SECONDS:-60}"
