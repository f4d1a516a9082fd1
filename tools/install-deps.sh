#!/usr/bin/env bash
# Installs the Debian packages ferry builds and tests with (Debian 12, as
# root). Skips apt entirely when everything is already present.
set -euo pipefail
PKGS=(build-essential cmake g++ git python3 python3-pip unzip
      nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      clang libclang-rt-14-dev libcpp-httplib-dev pkg-config)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "ferry: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
