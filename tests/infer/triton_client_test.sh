#!/usr/bin/env bash
# tessel serve with a real KServe v2 client: Python's tritonclient[http], installed from PyPI into
# a venv under ~/.cache/tessel/clients (once; later runs reuse it). Exits 77 (ctest: skipped),
# saying why, when the venv cannot be made or PyPI cannot be reached.
# Usage: triton_client_test.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
src=$2
venv=${TESSEL_CLIENTS:-$HOME/.cache/tessel/clients}/triton
if ! "$venv/bin/python" -c 'import tritonclient.http, numpy' 2>/dev/null; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    echo "SKIP: python3 -m venv failed (install python3-venv)"
    exit 77
  fi
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --timeout 20 \
      'tritonclient[http]' numpy; then
    rm -rf "$venv"
    echo "SKIP: cannot install tritonclient[http] from PyPI (no network?)"
    exit 77
  fi
fi
exec "$venv/bin/python" "$src/tests/infer/triton_client_test.py" "$tessel" "$src"
