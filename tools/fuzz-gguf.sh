#!/usr/bin/env bash
# Builds the GGUF libFuzzer target with clang, ASan and UBSan in build-fuzz and
# runs it for a bounded time over a copy of fuzz/corpus/gguf (the committed
# seeds stay untouched). Exits nonzero if the fuzzer finds a crash, a leak, a
# sanitizer report, a timeout or an out-of-memory input; the reproducer is
# left in build-fuzz/gguf-artifacts/.
#
#   tools/fuzz-gguf.sh [SECONDS [LIBFUZZER_FLAGS...]]   (default 60 s)
#   reproduce: build-fuzz/fuzz/gguf_fuzz build-fuzz/gguf-artifacts/crash-...
set -euo pipefail

seconds="${1:-60}"
shift || true
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -eq 0 ]]; then
  echo "usage: $0 [SECONDS]   (a positive number of seconds, default 60)" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
jobs="${FERRY_FUZZ_BUILD_JOBS:-2}"

cmake -S "$root" -B "$build" \
  -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFERRY_FUZZ=ON -DFERRY_SANITIZE=ON -DFERRY_TESTS=OFF -DFERRY_WERROR=ON >/dev/null
cmake --build "$build" --target gguf_fuzz -j "$jobs"

corpus="$(mktemp -d "${TMPDIR:-/tmp}/gguf-corpus.XXXXXX")"
trap 'rm -rf "$corpus"' EXIT
cp "$root"/fuzz/corpus/gguf/* "$corpus"/
artifacts="$build/gguf-artifacts"
mkdir -p "$artifacts"

echo "fuzzing GGUF reader for ${seconds}s (corpus copy: $corpus)"
status=0
# -max_len: room for several kvs and tensor infos beyond the seeds.
# -timeout: one input taking over 10 s is a hang. -rss_limit_mb (libFuzzer
# also caps single mallocs at this) catches absurd allocations.
"$build/fuzz/gguf_fuzz" "$corpus" \
  -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$artifacts/" -print_final_stats=1 "$@" || status=$?

if [[ $status -ne 0 ]]; then
  echo "gguf_fuzz FAILED (exit $status); reproducer(s) in $artifacts/:" >&2
  ls -1t "$artifacts" | head -5 >&2
  exit "$status"
fi
echo "gguf_fuzz: no crashes in ${seconds}s"
