#!/usr/bin/env bash
# Checks that a binary built with the default flags runs on any x86-64 CPU: every function
# whose machine code has a VEX or EVEX instruction (a mnemonic starting with v: AVX and later)
# belongs to an ISA level's kernels (tessel::ops::avx2, ::avx512, ::avx512_bf16, reached only
# through the kernel table), and every function with AVX-512 registers (zmm, the mask registers)
# to an AVX-512 level's. Anything else would be an inline function or template that an ISA
# translation unit emitted and the linker picked for everyone (src/ops/kernels.h says why).
# Usage: isa_symbols_test.sh BINARY...
set -euo pipefail
status=0
listing=$(mktemp)
trap 'rm -f "$listing"' EXIT
for bin in "$@"; do
  objdump -d --no-show-raw-insn -C "$bin" > "$listing"
  report=$(awk '
    function flush() {
      if (fn == "") return
      avx512_ok = fn ~ /tessel::ops::avx512(_bf16)?::/
      vex_ok = avx512_ok || fn ~ /tessel::ops::avx2::/
      if (evex && !avx512_ok) print "AVX-512 code outside the AVX-512 kernels: " fn
      else if (vex && !vex_ok) print "AVX code outside the ISA kernels: " fn
    }
    /^[0-9a-f]+ <.*>:$/ { flush(); fn = substr($0, index($0, "<") + 1); vex = 0; evex = 0; next }
    /^ *[0-9a-f]+:\t/ {
      split($0, part, "\t"); insn = part[2]
      if (insn ~ /^v[a-z]/) vex = 1
      if (insn ~ /%zmm|%k[0-7]/) evex = 1
    }
    END { flush() }' "$listing")
  functions=$(grep -c '^[0-9a-f]* <.*tessel::ops::avx' "$listing" || true)
  if [ -n "$report" ]; then
    echo "$bin:"
    echo "$report" | head -20
    status=1
  else
    echo "$bin: clean ($functions functions of the ISA kernels)"
  fi
done
exit $status
