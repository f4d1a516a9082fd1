#!/usr/bin/env bash
# README command 2: the whole test suite. Builds and runs it twice: an
# optimised build with warnings as errors, then an ASan+UBSan build; then
# fuzzes the GGUF reader for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/fetch-model.sh >/dev/null
jobs=$(nproc)

echo "== release build (-Werror)"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DFERRY_WERROR=ON >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs"

echo "== ASan + UBSan build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFERRY_WERROR=ON \
  -DFERRY_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 FERRY_SANITIZED=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

echo "== fuzz the GGUF reader (${FERRY_FUZZ_SECONDS:-60} s)"
bash tools/fuzz-gguf.sh "${FERRY_FUZZ_SECONDS:-60}"
