#!/usr/bin/env bash
# Installs the Debian packages tessel's build, tests and demo need, and with nvcc on PATH the
# cudnn-frontend headers the CUDA build needs. Idempotent: runs apt-get update and install only
# when a package is missing, and fetches the headers only when their version is not there.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev zlib1g-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libbenchmark-dev libopenmpi-dev openmpi-bin
  dataset-fashion-mnist fortunes python3-torch python3-numpy
  iproute2 iperf3 libcpp-httplib-dev wrk libboost-dev
  python3-matplotlib python3-protobuf protobuf-compiler libprotobuf-dev libssl-dev libisal-dev libpcre2-dev
  chromium tmux clang-format
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# With nvcc on PATH the CUDA build also needs cuDNN's C++ frontend (header-only; cuDNN's fused
# attention is reached through its graphs): its headers from PyPI's wheel, into
# ~/.cache/tessel/cudnn-frontend (src/ops/cuda/CMakeLists.txt looks there, or CUDNN_FRONTEND_ROOT).
CUDNN_FRONTEND=1.32.0
fe_dir="${XDG_CACHE_HOME:-$HOME/.cache}/tessel/cudnn-frontend"
if command -v nvcc >/dev/null && [ "$(cat "$fe_dir/VERSION" 2>/dev/null)" != "$CUDNN_FRONTEND" ]; then
  echo "setup: fetching cudnn-frontend $CUDNN_FRONTEND headers into $fe_dir"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$CUDNN_FRONTEND"
  rm -rf "$fe_dir" && mkdir -p "$fe_dir"
  python3 - "$tmp"/*.whl "$fe_dir" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("include/")])
PY
  echo "$CUDNN_FRONTEND" >"$fe_dir/VERSION"
  rm -rf "$tmp"
fi
