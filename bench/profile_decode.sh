#!/usr/bin/env bash
# Profiles kv_decode's decode steps (not its prefill) with perf: starts a
# long single-row decode, waits for the prefill to finish, samples the
# process for SECONDS, and prints the flat profile. Build with
# -DCMAKE_CXX_FLAGS=-g (debug info only; code is unchanged) for
# `perf annotate` to show source lines.
#
# usage: bench/profile_decode.sh BUILD_DIR FORMAT CONTEXT [SECONDS] [OUT_DIR]
set -euo pipefail
build=$1 fmt=$2 ctx=$3 secs=${4:-30}
out=${5:-$(mktemp -d)}
mkdir -p "$out"
"$build/bench/kv_decode" --formats "$fmt" --contexts "$ctx" --batches 1 \
  --steps 400 --repeats 1 >"$out/kv_decode.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT
until grep -q "f32 prefill" "$out/kv_decode.log"; do
  kill -0 "$pid" || { cat "$out/kv_decode.log"; exit 1; }
  sleep 1
done
sleep 5  # the copy into $fmt's cache, then decode steps only
perf record -F 999 -p "$pid" -o "$out/perf.data" -- sleep "$secs" 2>"$out/perf_record.log"
echo "# $fmt, context $ctx, load $(cut -d' ' -f1-3 /proc/loadavg); data in $out"
perf report -i "$out/perf.data" --no-children --percent-limit 0.5 --stdio 2>/dev/null |
  grep -v '^$'
