#!/usr/bin/env bash
# GPU tests of the CUDA backend (tests/cuda), for a machine with an NVIDIA
# GPU. CI has no GPU and never runs this; docs/CUDA.md records the last
# results.
#
#   tools/cuda/test.sh [BUILD_DIR]
#
# BUILD_DIR holds a -DFERRY_CUDA=ON build (tests/test_cuda and ferry); if it
# has none, one is configured and built there (needs CMake >= 3.25, the
# CUDA toolkit and the Debian -dev packages of tools/install-deps.sh).
# Prints each check's figures ([gpu-vs-cpu] lines) and gtest's summary.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
if [[ ! -x $build/tests/test_cuda ]]; then
  cmake -S . -B "$build" -DFERRY_CUDA=ON -DCMAKE_BUILD_TYPE=Release
  cmake --build "$build" -j"$(nproc)" --target test_cuda ferry
fi
# Libraries a build made on another machine may need: Debian's cpp-httplib
# (carried in .devlibs: tools/cuda/pack-build.sh) and the CUDA toolkit's
# cuBLAS.
for d in "$PWD/.devlibs" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d $d ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
export FERRY_TEST_DATA="$PWD/tests/data"
"$build/tests/test_cuda" --gtest_color=no "${@:2}"
