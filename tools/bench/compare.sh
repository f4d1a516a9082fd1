#!/usr/bin/env bash
# The one command of issue 5: ferry against llama.cpp and mlx-lm on this
# machine, in one run, and docs/BENCHMARKS.md rewritten from what it measured.
#
#   bash tools/bench/compare.sh [compare.py options]   e.g. --reps 5, --skip-serve
#
# 1. installs the peers and makes the models (tools/peers/*, into
#    ${FERRY_CACHE:-~/.cache/ferry}; nothing is downloaded at ferry's run time);
# 2. builds ferry and bench/roofline (Release) in ${FERRY_BUILD:-build};
# 3. runs tools/bench/compare.py: roofline, single-stream decode and 512-token
#    prefill (llama-bench vs ferry run vs mlx-lm), serving (ferry serve vs
#    llama-server vs mlx_lm.server, one client), engines interleaved and
#    repeated; raw records go to $CACHE/bench/<time>/results.jsonl;
# 4. tools/bench/report.py writes the measured section of docs/BENCHMARKS.md.
# FERRY_SKIP_MLX=1 leaves mlx-lm out (it is slow on CPU: minutes per model).
# FERRY_BUILD=DIR builds there instead of build/; FERRY_NO_BUILD=1 skips it.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO="$PWD"
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}"
BUILD="${FERRY_BUILD:-build}"
OUT="$CACHE/bench/$(date -u +%Y%m%d-%H%M%S)"

# 1. ferry's build dependencies (Google Benchmark for bench/), peers, models.
bash tools/install-deps.sh
LBIN="$(bash tools/peers/install-llama-cpp.sh)"
MLX_ARGS=()
if [[ "${FERRY_SKIP_MLX:-0}" != 1 ]]; then
  MBIN="$(bash tools/peers/install-mlx-lm.sh)"
  MLX_ARGS=(--mlx-bin "$MBIN")
fi
MODELS="$(bash tools/peers/make-models.sh)"

# Python for the client (aiohttp, tokenizers; pinned in requirements.txt).
BV="$CACHE/peers/bench-venv"
if [[ ! -f "$BV/.done" ]] || ! cmp -s tools/bench/requirements.txt "$BV/.done"; then
  python3 -m venv "$BV"
  "$BV/bin/python" -m pip install --quiet --disable-pip-version-check -r tools/bench/requirements.txt >&2
  cp tools/bench/requirements.txt "$BV/.done"
fi

# 2. ferry and the roofline program (FERRY_NO_BUILD=1: use what $BUILD has).
if [[ "${FERRY_NO_BUILD:-0}" != 1 ]]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFERRY_TESTS=OFF -DFERRY_BENCH=ON >/dev/null
  cmake --build "$BUILD" --target ferry roofline -j"$(nproc)"
fi

# 3. Measure.
mkdir -p "$OUT"
echo "compare: raw results in $OUT" >&2
RESULTS="$(python3 tools/bench/compare.py \
  --out-dir "$OUT" --ferry "$BUILD/ferry" --roofline "$BUILD/bench/roofline" \
  --llama-bin "$LBIN" "${MLX_ARGS[@]}" --models-dir "$MODELS" \
  --tokenizer "$MODELS/hf/SmolLM2-135M-Instruct-f32/tokenizer.json" \
  --bench-python "$BV/bin/python" --python-gguf "$CACHE/peers/convert-venv/bin/python" \
  --gguf-py "$(dirname "$LBIN")/src/gguf-py" "$@")"

# 4. Report.
python3 tools/bench/report.py "$RESULTS" docs/BENCHMARKS.md
