#!/usr/bin/env bash
# Installs the Debian packages tessel's build, tests and demo need. Idempotent: runs
# apt-get update and install only when a package is missing.
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
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
