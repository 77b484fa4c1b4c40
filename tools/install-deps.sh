#!/usr/bin/env bash
# Installs tokpipec's build and test dependencies from Debian 12 packages (and the ONNX
# node tests newer than Debian's from one PyPI wheel). Idempotent: skips what is present.
set -euo pipefail

packages=(
  cmake make gcc clang libclang-rt-14-dev
  protobuf-c-compiler libprotobuf-c-dev libonnx-dev
  libopenblas-dev openmpi-bin libopenmpi-dev
  llvm-14-tools libonnx-testdata python3-onnx python3-torch
  python3-pip unzip
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
