#!/usr/bin/env bash
# tessel's BPE against tiktoken (from PyPI, in a venv under ~/.cache/tessel/clients; once, later
# runs reuse it), token for token on a small mixed text (tiktoken_check.py; the 10 MB check is
# bench/bpe_bench). Exits 77 (ctest: skipped), saying why, when the venv cannot be made or PyPI
# cannot be reached.
# Usage: tiktoken_test.sh TESSEL_BINARY SOURCE_DIR [tiktoken_check.py options]
set -euo pipefail
tessel=$1
src=$2
shift 2
venv=${TESSEL_CLIENTS:-$HOME/.cache/tessel/clients}/tiktoken
if ! "$venv/bin/python" -c 'import tiktoken' 2>/dev/null; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    echo "SKIP: python3 -m venv failed (install python3-venv)"
    exit 77
  fi
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --timeout 20 tiktoken; then
    rm -rf "$venv"
    echo "SKIP: cannot install tiktoken from PyPI (no network?)"
    exit 77
  fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" "$src/tests/text/tiktoken_check.py" "$tessel" "$work" --mb 0.2 --vocab 1000 "$@"
