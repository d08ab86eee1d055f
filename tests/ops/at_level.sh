#!/usr/bin/env bash
# Runs a kernel test binary at one ISA level (TESSEL_ISA=LEVEL), so that the suites of every
# kernel run at each level the host supports; exits 77 (skipped) unless LEVEL is below the
# host's (the plain run of the binary covers the host's own level).
# Usage: at_level.sh LEVEL TESSEL_BINARY TEST_BINARY [gtest arguments...]
set -euo pipefail
level=$1 tessel=$2 binary=$3
shift 3
order=(portable avx2 avx512 avx512_bf16)
rank() { for i in "${!order[@]}"; do [ "${order[$i]}" = "$1" ] && echo "$i"; done; }
host=$("$tessel" --version | sed -n 's/^isa: .*(host \([a-z0-9_]*\);.*/\1/p')
if [ -z "$host" ] || [ -z "$(rank "$level")" ]; then
  echo "at_level: cannot tell the host level ('$host') or unknown level '$level'" >&2
  exit 1
fi
if [ "$(rank "$level")" -ge "$(rank "$host")" ]; then
  echo "at_level: the host's level is $host; the plain run covers $level or it is above: skipped"
  exit 77
fi
TESSEL_ISA=$level exec "$binary" --gtest_brief=1 "$@"
