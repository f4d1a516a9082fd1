#!/usr/bin/env bash
# Makes the benchmark models of issue 5 in ${FERRY_CACHE:-~/.cache/ferry}/models
# (never in the repository). Idempotent: a file that exists is kept.
#
#   SmolLM2-135M-Instruct.Q4_1.gguf     as shipped (tools/fetch-model.sh)
#   SmolLM2-135M-Instruct.{F16,Q8_0}.gguf
#       hf/SmolLM2-135M-Instruct-f32 (transformers' dequantization of the
#       Q4_1 file) through convert_hf_to_gguf.py of the pinned llama.cpp.
#       Caveat: their weights are Q4_1's values, so they are as fast as the
#       real F16/Q8_0 files but no better in quality than Q4_1.
#   Llama-3.2-1B-shape-random.{F16,Q8_0,Q4_K_M}.gguf
#       random weights (seed 0, tools/peers/make_models.py), quantized by the
#       pinned llama-quantize. Random weights measure speed only.
#   hf/SmolLM2-135M-Instruct-f32, hf/Llama-3.2-1B-shape-random-f16
#       HF directories that mlx-lm loads as they are. mlx-lm gets unquantized
#       weights because its CPU backend is fastest with them: measured here,
#       SmolLM2 decodes at ~8 tok/s in float32, ~3 in float16 and ~0.3 with
#       MLX's 4-bit affine quantization (mlx_lm.convert -q), whose CPU
#       kernels are not vectorized.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}"
MODELS="$CACHE/models"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$MODELS/hf"

LBIN="$(bash "$HERE/install-llama-cpp.sh")"
LSRC="$(dirname "$LBIN")/src"
Q41="$(bash "$REPO/tools/fetch-model.sh")"

# Python for conversion: the pinned converter imports sentencepiece even for
# BPE models; everything else is usually in the system's site-packages.
CV="$CACHE/peers/convert-venv"
if [[ ! -f "$CV/.done" ]]; then
  python3 -m venv --system-site-packages "$CV"
  "$CV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$HERE/requirements.txt" >&2
  touch "$CV/.done"
fi
PY="$CV/bin/python"
# gguf-py from the same sdist as the binaries (shadows any installed gguf).
GGUF_PY="$LSRC/gguf-py"

step() { echo "models: $*" >&2; }

# ---------------------------------------------------------------- SmolLM2
SMOL=SmolLM2-135M-Instruct
HF_SMOL="$MODELS/hf/$SMOL-f32"
if [[ ! -f "$HF_SMOL/config.json" ]]; then
  step "$HF_SMOL (dequantized from Q4_1)"
  "$PY" "$HERE/make_models.py" hf-dir "$Q41" "$HF_SMOL" --dtype float32 >/dev/null
fi
for t in F16 Q8_0; do
  out="$MODELS/$SMOL.$t.gguf"
  if [[ ! -s "$out" ]]; then
    step "$out"
    PYTHONPATH="$GGUF_PY" "$PY" "$LSRC/convert_hf_to_gguf.py" "$HF_SMOL" \
      --outtype "$(tr '[:upper:]' '[:lower:]' <<<"$t")" --outfile "$out.part" >/dev/null 2>&1 ||
      { echo "models: convert_hf_to_gguf.py failed for $out" >&2; exit 1; }
    mv "$out.part" "$out"
  fi
done

# --------------------------------------------------- Llama-3.2-1B-shaped
RND=Llama-3.2-1B-shape-random
if [[ ! -s "$MODELS/$RND.F16.gguf" ]]; then
  step "$MODELS/$RND.F16.gguf (random weights, seed 0)"
  PYTHONPATH="$GGUF_PY" "$PY" "$HERE/make_models.py" random-llama "$MODELS/$RND.F16.gguf" \
    --vocab-from "$Q41" --seed 0 >/dev/null
fi
for t in Q8_0 Q4_K_M; do
  out="$MODELS/$RND.$t.gguf"
  if [[ ! -s "$out" ]]; then
    step "$out (llama-quantize)"
    "$LBIN/llama-quantize" "$MODELS/$RND.F16.gguf" "$out.part" "$t" >/dev/null 2>&1 ||
      { echo "models: llama-quantize failed for $out" >&2; exit 1; }
    mv "$out.part" "$out"
  fi
done

# ------------------------------------------------------------------- mlx
# mlx-lm loads HF directories as they are. The random model gets one too
# (float16; float32 would be 5 GB), with SmolLM2's tokenizer files.
HF_RND="$MODELS/hf/$RND-f16"
if [[ ! -f "$HF_RND/config.json" ]]; then
  step "$HF_RND (the random GGUF as an HF directory)"
  PYTHONPATH="$GGUF_PY" "$PY" "$HERE/make_models.py" hf-from-random \
    "$MODELS/$RND.F16.gguf" "$HF_RND" --tokenizer-dir "$HF_SMOL" >/dev/null
fi
echo "$MODELS"
