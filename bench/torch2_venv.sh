#!/usr/bin/env bash
# Makes (once) the virtual environment with PyTorch 2.x that bench/compare_torch.sh compares
# against beside Debian's PyTorch 1.13, and prints its python. A bench dependency only, never a
# build or test one: the PyPI wheel brings its CUDA libraries too (about 5.4 GB; 5-25 minutes on the shared machines).
#   bench/torch2_venv.sh            # venv in $TORCH2_VENV, default ~/.cache/tessel/torch2
set -euo pipefail
version=2.15.0  # the newest PyTorch on PyPI when this bench was written (2026-11)
venv=${TORCH2_VENV:-$HOME/.cache/tessel/torch2}
if ! "$venv/bin/python" -c "import torch, numpy; assert torch.__version__.startswith('$version')" \
    2>/dev/null; then
  echo "torch2_venv: installing torch==$version into $venv (once; about 5.4 GB)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "torch==$version" numpy >&2
fi
echo "$venv/bin/python"
