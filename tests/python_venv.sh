#!/usr/bin/env bash
# Runs a Python SCRIPT with a client library from PyPI (tritonclient, openai, tiktoken), installed
# into a venv under ~/.cache/tessel/clients/NAME once; later runs reuse it. Exits 77 (ctest:
# skipped), saying why, when the venv cannot be made or PyPI cannot be reached.
# Usage: python_venv.sh NAME IMPORTS PACKAGES SCRIPT [ARGS...]
#   e.g. python_venv.sh openai openai openai tests/infer/openai_client_test.py build/apps/tessel/tessel .
set -euo pipefail
name=$1 imports=$2 packages=$3 script=$4
shift 4
venv=${TESSEL_CLIENTS:-$HOME/.cache/tessel/clients}/$name
if ! "$venv/bin/python" -c "import $imports" 2>/dev/null; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv"; then
    echo "SKIP: python3 -m venv failed (install python3-venv)"
    exit 77
  fi
  # shellcheck disable=SC2086  # PACKAGES is a list
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --timeout 20 $packages; then
    rm -rf "$venv"
    echo "SKIP: cannot install $packages from PyPI (no network?)"
    exit 77
  fi
fi
exec "$venv/bin/python" "$script" "$@"
