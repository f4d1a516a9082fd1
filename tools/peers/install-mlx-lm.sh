#!/usr/bin/env bash
# Installs the mlx-lm peer for issue 5's benchmarks: a virtual environment
# in ${FERRY_CACHE:-~/.cache/ferry}/peers/mlx-lm-<pin>/ with pinned mlx[cpu]
# (MLX's Linux CPU backend) and mlx-lm from PyPI. Idempotent.
# Prints the venv's bin directory (mlx_lm.generate, mlx_lm.server, python).
set -euo pipefail
MLX_PIN=0.32.4
MLX_LM_PIN=0.32.2
ROOT="${FERRY_CACHE:-$HOME/.cache/ferry}/peers/mlx-lm-$MLX_LM_PIN"
VENV="$ROOT/venv"

if [[ ! -f "$VENV/.done" ]]; then
  echo "peers: installing mlx[cpu]==$MLX_PIN mlx-lm==$MLX_LM_PIN into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "mlx[cpu]==$MLX_PIN" "mlx-lm==$MLX_LM_PIN" >&2
  # Fails here, not in the middle of a benchmark, when MLX cannot run.
  "$VENV/bin/python" -c 'import mlx.core as mx, mlx_lm; print("peers: mlx", mx.__version__, "device", mx.default_device())' >&2
  echo "mlx[cpu]==$MLX_PIN mlx-lm==$MLX_LM_PIN" >"$VENV/.done"
fi
echo "$VENV/bin"
