#!/usr/bin/env bash
# GPU benchmarks of issue 6 on one NVIDIA GPU: ferry (deterministic and
# fast modes) and Hugging Face transformers on a Llama-3.1-8B-shaped model
# with random weights made here from a seed. Random weights measure speed
# only. docs/BENCHMARKS.md ("GPU") records the last results.
#
#   tools/cuda/bench.sh [BUILD_DIR] [OUT_DIR]
#
# BUILD_DIR: a -DFERRY_CUDA=ON build (built there if it has no ferry).
# OUT_DIR (default $OUT or /tmp/ferry-gpu-bench): one JSON per run.
# Environment: SHAPE (llama-3.1-8b), TYPES (bf16), RUNS (which groups:
# single,batch,kv,hf; also llamacpp, with LLAMA_CUDA_BIN), BATCHES
# (64,256), MODES (deterministic,fast; also nographs: deterministic without
# CUDA graphs; fp8: fast mode with --fp8, the layers' weights in FP8),
# MATMUL (int8 or exact: --matmul for quantized weights; ferry's default,
# int8, if unset), KV_Q8 (set: also 8-bit KV at 4k), DEVICE (cuda; cpu
# runs the same commands on the CPU, to try this script without a GPU).
# Comparing builds or settings in one call (an A/B run):
#   VARIANTS="NAME=DIR[:VAR=VALUE,...] ..." each variant's ferry is
#     DIR/ferry, run with those environment variables set; BUILD_DIR is
#     then unused. E.g. VARIANTS="main=/tmp/a exp=/tmp/b g1=/tmp/b:FERRY_CUDA_FP8_GROUP=1"
#   ROUNDS (1) every run repeated, all variants in turn within a round,
#     so a shared machine's drift falls on every variant alike.
# Runs are then named TAG.NAME.rK (JSON in OUT_DIR), and a table at the
# end gives each variant's figures, their mean and its ratio to the first
# variant's mean.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
out=${2:-${OUT:-/tmp/ferry-gpu-bench}}
shape=${SHAPE:-llama-3.1-8b}
types=${TYPES:-bf16}
runs=${RUNS:-single,batch,kv,hf}
batches=${BATCHES:-64,256}
device=${DEVICE:-cuda}
rounds=${ROUNDS:-1}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench: ROUNDS must be a positive number" >&2; exit 2; }
mkdir -p "$out"
# The variants: name, build directory, environment (VAR=VALUE,...).
vnames=() vdirs=() venvs=()
if [[ -n ${VARIANTS:-} ]]; then
  for v in $VARIANTS; do
    [[ $v == ?*=?* ]] || { echo "bench: variant '$v' is not NAME=DIR[:VAR=VALUE,...]" >&2; exit 2; }
    rest=${v#*=}
    vnames+=("${v%%=*}") vdirs+=("${rest%%:*}")
    if [[ $rest == *:* ]]; then venvs+=("${rest#*:}"); else venvs+=(""); fi
    [[ ${vnames[-1]} =~ ^[A-Za-z0-9_+-]+$ ]] ||
      { echo "bench: variant name '${vnames[-1]}': letters, digits, _ + - only" >&2; exit 2; }
    [[ -x ${vdirs[-1]}/ferry ]] || { echo "bench: no ${vdirs[-1]}/ferry (variant ${vnames[-1]})" >&2; exit 2; }
  done
else
  if [[ ! -x $build/ferry ]]; then
    cmake -S . -B "$build" -DFERRY_CUDA=ON -DCMAKE_BUILD_TYPE=Release
    cmake --build "$build" -j"$(nproc)" --target ferry
  fi
  vnames=("") vdirs=("$build") venvs=("")
fi
for d in "$PWD/.devlibs" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d $d ]] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
fi
models=${MODEL_DIR:-/tmp/ferry-models}
mkdir -p "$models"
has() { [[ ,$runs, == *,$1,* ]]; }

# ferry bench NAME ARGS...: one run per variant and round, each JSON kept
# and summed up in one line.
fb() {
  local base=$1 r i
  shift
  for ((r = 1; r <= rounds; r++)); do
    for i in "${!vnames[@]}"; do
      local name=$base
      [[ -n ${vnames[i]} ]] && name+=.${vnames[i]}
      ((rounds > 1)) && name+=.r$r
      local envs=()
      [[ -n ${venvs[i]} ]] && IFS=, read -ra envs <<<"${venvs[i]}"
      fb1 "$name" "${vdirs[i]}/ferry" "${envs[@]}" -- "$@"
    done
  done
}
# fb1 NAME FERRY [VAR=VALUE...] -- ARGS...: one run.
fb1() {
  local name=$1 bin=$2 t0 envs=()
  shift 2
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  t0=$(date +%s)
  env "${envs[@]}" "$bin" bench --device "$device" --quiet --json "$@" >"$out/$name.json"
  python3 - "$out/$name.json" "$name" "$(($(date +%s) - t0))" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:24s} [{sys.argv[3]:>3s} s] out {j['output_tok_s']:9.1f} tok/s  decode/stream "
      f"{j['decode_tok_s']:7.1f} tok/s  TTFT p50 {j['ttft_ms']['p50']:8.1f} ms  "
      f"ITL p50 {j['itl_ms']['p50']:6.1f} p99 {j['itl_ms']['p99']:6.1f} ms  "
      f"KV peak {j['kv_peak_bytes'] / 2**30:.2f} GiB", flush=True)
PY
}

for t in ${types//,/ }; do
  model=$models/$shape-$t.gguf
  if [[ ! -f $model ]]; then
    s=$(date +%s)
    python3 tools/cuda/make_random_gguf.py "$model" --shape "$shape" --type "$t" --seed 0
    echo "made $model in $(($(date +%s) - s)) s"
  fi
  for mode in $(echo "${MODES:-deterministic,fast}" | tr , ' '); do
    tag=$t-$mode
    case $mode in
      deterministic) flags=(--deterministic) ;;
      fast) flags=(--no-deterministic) ;;
      nographs) flags=(--deterministic --no-cuda-graphs) ;;  # kernel by kernel
      fp8) flags=(--no-deterministic --fp8) ;;
      *) echo "unknown mode $mode (deterministic, fast, nographs, fp8)" >&2; exit 2 ;;
    esac
    [[ -n ${MATMUL:-} ]] && flags+=(--matmul "$MATMUL") && tag=$tag-$MATMUL
    if has single; then
      fb "$tag-single" -m "$model" "${flags[@]}" --requests 3 --concurrency 1 --warmup 1 \
        --prompt-tokens 128 --output-tokens 128
    fi
    if has batch; then
      for b in ${batches//,/ }; do
        fb "$tag-c$b" -m "$model" "${flags[@]}" --requests "$b" --concurrency "$b" --warmup 4 \
          --prompt-tokens 128 --output-tokens 128 --max-batch "$b" --step-tokens 8192 \
          --prefill-chunk 128 --step-target-ms 0
      done
    fi
  done
  if has kv; then
    for kvf in "--kv-dtype bf16" "--kv-bits 4 --kv-group 64" ${KV_Q8:+"--kv-bits 8 --kv-group 64"}; do
      name=$t-kv-$(echo "$kvf" | tr -d ' -' | sed 's/kvdtype//; s/kvbits/q/; s/kvgroup/g/')
      # shellcheck disable=SC2086
      fb "$name-4k" -m "$model" --deterministic $kvf --requests 2 --concurrency 1 --warmup 1 \
        --prompt-tokens 4096 --output-tokens 64 --prefill-chunk 512 --step-tokens 512
    done
  fi
done
# llama.cpp built for CUDA (tools/cuda/build-llama-cpp-cuda.sh; its
# llama-batched-bench, or that file xz-compressed to fit a device call, in
# LLAMA_CUDA_BIN): a static batch of N sequences of 128 prompt + 128
# generated tokens each, N = 1 for a single stream (its output tok/s: N *
# 128 / total time, the figure `ferry bench` gives; TG: decode only), and
# the ratio of each ferry run of the same call (run RUNS=...,llamacpp
# after ferry's groups) to llama.cpp at the same stream count.
if has llamacpp; then
  lbin=${LLAMA_CUDA_BIN:-$PWD/.peers}
  lbb=$lbin/llama-batched-bench
  if [[ ! -x $lbb && -f $lbb.xz ]]; then
    lbb=/tmp/llama-batched-bench
    xz -dc "$lbin/llama-batched-bench.xz" >"$lbb" && chmod +x "$lbb"
  fi
  for t in ${types//,/ }; do
    model=$models/$shape-$t.gguf
    maxb=$(echo "1,$batches" | tr , '\n' | sort -n | tail -1)
    "$lbb" -m "$model" -c $((maxb * 256)) -b 8192 -ub 2048 -npp 128 -ntg 128 \
      -npl "1,$batches" -ngl 99 -fa on --output-format jsonl >"$out/llamacpp-$t-batched.log" 2>&1 ||
      echo "llama-batched-bench failed (log: $out/llamacpp-$t-batched.log)"
    # Then each ferry run of this type already in OUT_DIR (same call) against
    # llama.cpp at the same stream count: output tok/s, ferry / llama.cpp.
    python3 - "$out/llamacpp-$t-batched.log" "$t" "$out" <<'PY' || true
import glob, json, os, re, sys
peer = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        peer[r["pl"]] = r["pl"] * r["tg"] / r["t"]
        print(f"llama.cpp {sys.argv[2]:7s} batch {r['pl']:4d}: out {peer[r['pl']]:9.1f} tok/s  "
              f"TG {r['speed_tg']:9.1f} tok/s  PP {r['speed_pp']:9.1f} tok/s  total {r['t']:.2f} s", flush=True)
for path in sorted(glob.glob(os.path.join(sys.argv[3], f"{sys.argv[2]}-*.json"))):
    m = re.fullmatch(r".*-(single|c(\d+))(\.[^.]+)*\.json", os.path.basename(path))
    if not m:
        continue
    n = 1 if m.group(1) == "single" else int(m.group(2))
    if n in peer:
        mine = json.load(open(path))["output_tok_s"]
        print(f"ratio {os.path.basename(path)[:-5]:24s} {mine:9.1f} / llama.cpp {peer[n]:9.1f} = "
              f"{mine / peer[n]:.2f}x", flush=True)
PY
  done
fi

if has hf; then
  PYTHONUNBUFFERED=1 python3 tools/cuda/hf_peer.py --shape "$shape" --batches "$batches" \
    --json "$out/hf.json" || echo "transformers peer failed"
fi

# An A/B run's table: each run group's figures by variant and round.
if [[ -n ${VARIANTS:-} ]] || ((rounds > 1)); then
  python3 - "$out" "${vnames[@]}" <<'PY'
import glob, json, os, re, sys
out, names = sys.argv[1], sys.argv[2:]
runs = {}  # run group -> variant -> output tok/s of each round
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    parts = os.path.basename(path)[:-5].split(".")
    if re.fullmatch(r"r\d+", parts[-1]):
        parts.pop()
    try:
        tok_s = json.load(open(path))["output_tok_s"]
    except (KeyError, TypeError, ValueError):
        continue
    runs.setdefault(parts[0], {}).setdefault(parts[1] if len(parts) > 1 else "", []).append(tok_s)
print("A/B: output tok/s by round, their mean, and the mean against the first variant's")
for group in sorted(runs):
    first = None
    for name in names:
        vals = runs[group].get(name)
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        first = first or mean
        print(f"{group:24s} {name or '-':10s} " + " ".join(f"{v:9.1f}" for v in vals) +
              f"   mean {mean:9.1f}  {mean / first:.3f}x", flush=True)
PY
fi
