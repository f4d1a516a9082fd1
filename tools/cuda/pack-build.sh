#!/usr/bin/env bash
# Packs a -DFERRY_CUDA=ON build made here for a GPU machine reached by copy
# (the lent device machines take at most 64 MiB a call, repository
# included): ferry and tests/test_cuda stripped and xz-compressed into one
# tarball, and the Debian libraries ferry links that such a machine may
# lack (cpp-httplib and brotli) into .devlibs, where tools/cuda/test.sh and
# tools/cuda/bench.sh look for them.
#
#   tools/cuda/pack-build.sh [--ferry-only] [BUILD_DIR] [OUT_TAR]
#
# BUILD_DIR defaults to build-cuda, OUT_TAR to .devbuild.tar.xz (both names
# are git-ignored; carry OUT_TAR and .devlibs). --ferry-only leaves
# test_cuda out (about 8 MB less: room for .peers' llama.cpp beside it).
# On the GPU machine:
#   mkdir -p /tmp/b && tar -xJf .devbuild.tar.xz -C /tmp/b
#   tools/cuda/test.sh /tmp/b; tools/cuda/bench.sh /tmp/b
set -euo pipefail
cd "$(dirname "$0")/../.."
only_ferry=
args=()
for a in "$@"; do
  if [[ $a == --ferry-only ]]; then only_ferry=1; else args+=("$a"); fi
done
build=${args[0]:-build-cuda}
out=${args[1]:-.devbuild.tar.xz}
[[ -x $build/ferry ]] || { echo "pack-build: no $build/ferry (build with -DFERRY_CUDA=ON first)" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
strip -o "$stage/ferry" "$build/ferry"
if [[ -z $only_ferry ]]; then
  [[ -x $build/tests/test_cuda ]] || { echo "pack-build: no $build/tests/test_cuda" >&2; exit 1; }
  mkdir -p "$stage/tests"
  strip -o "$stage/tests/test_cuda" "$build/tests/test_cuda"
fi
tar -cf - -C "$stage" . | xz -T0 -6 >"$out"
mkdir -p .devlibs
ldd "$build/ferry" | awk '/libcpp-httplib|libbrotli/ {print $3}' | while read -r lib; do
  cp -L "$lib" .devlibs/
done
echo "pack-build: $out ($(du -h "$out" | cut -f1)), .devlibs ($(du -sh .devlibs | cut -f1))" >&2
