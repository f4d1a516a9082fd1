#!/usr/bin/env bash
# README command 1: installs what ferry needs, fetches the default model and
# builds ferry (Release) into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/fetch-model.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFERRY_TESTS=OFF >/dev/null
cmake --build build --target ferry -j"$(nproc)"
