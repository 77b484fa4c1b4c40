#!/usr/bin/env bash
# Installs tokpipec's build and test dependencies from Debian 12 packages (and the ONNX
# node tests newer than Debian's from one PyPI wheel). Idempotent: skips what is present.
# Run as root or with sudo. TOKPIPE_NODE_TESTS overrides where the wheel's tests go.
set -euo pipefail

packages=(
  cmake make gcc g++ pkg-config clang libclang-rt-14-dev libomp-14-dev
  protobuf-c-compiler libprotobuf-c-dev libonnx-dev
  libopenblas-dev openmpi-bin libopenmpi-dev
  llvm-14-tools libonnx-testdata python3-onnx python3-torch
  python3-pip ca-certificates unzip
  shellcheck xz-utils
)

sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ONNX backend node tests for Gelu (opset 20), Attention (opset 23) and Split-18, which
# Debian's libonnx-testdata (ONNX 1.12) lacks. ONNX 1.22.0 is the newest release that still
# ships them (1.23 dropped the data) and writes its Attention tests at opset 23 (1.19-1.21
# wrote them at opset 24). The test data is the same in every wheel of a release; pinning one
# platform's wheel lets pip check a fixed hash. Unpacked: ~1770 test folders, ~11 MB.
onnx_version=1.22.0
onnx_wheel_sha256=1d0a2bdb15eb2b3cb65c438f3423d9620d14fdce32f92380e6bb1b2e09568ef5
node_tests=${TOKPIPE_NODE_TESTS:-/opt/tokpipe/onnx-node-tests}
marker=$node_tests/.from-onnx-$onnx_version

if [ ! -e "$marker" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "onnx==$onnx_version --hash=sha256:$onnx_wheel_sha256" > "$tmp/requirements.txt"
  # Download only (nothing is installed); Debian's pip, which python3-pip provides.
  /usr/bin/python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.11 \
    --implementation cp --abi cp311 --require-hashes -r "$tmp/requirements.txt" -d "$tmp"
  unzip -q "$tmp"/onnx-$onnx_version-*.whl 'onnx/backend/test/data/node/*' -d "$tmp/x"
  $sudo rm -rf "$node_tests"
  $sudo mkdir -p "$(dirname "$node_tests")"
  $sudo mv "$tmp/x/onnx/backend/test/data/node" "$node_tests"
  $sudo chmod -R a+rX "$node_tests"
  $sudo touch "$marker"
  echo "ONNX $onnx_version node tests: $(find "$node_tests" -mindepth 1 -maxdepth 1 -type d | wc -l) in $node_tests"
fi
