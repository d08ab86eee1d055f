#!/usr/bin/env bash
# The modern GPT (RMSNorm, rotary positions, SwiGLU) against the classic one (LayerNorm, a
# learned position table, GELU) on char-level text, side by side in one run (issue 29).
#   flock /tmp/tessel-bench.lock bench/modern_gpt.sh [BUILD_DIR] [STEPS] [SEEDS]
# Trains examples/char_gpt.toml and examples/char_gpt_modern.toml (the same data, optimizer,
# batch, schedule and sizes: 2 blocks, 4 heads, width 64, context 64) for STEPS steps (default
# 1500), once per seed 1..SEEDS (initialisation and batch order), and prints each model's
# parameter count and final test loss (nats per character: the mean over the seeds with its
# range), then modern minus classic. Quote the CPU line it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-1500}
seeds=${3:-1}
tessel="$build/apps/tessel/tessel"
[[ -x "$tessel" ]] || { echo "modern_gpt: $tessel missing; build it first" >&2; exit 1; }
out=$(mktemp -d /tmp/tessel_modern_gpt.XXXXXX)
trap 'rm -rf "$out"' EXIT
python3 bench/machine.py "$tessel"
for model in char_gpt char_gpt_modern; do
  for seed in $(seq 1 "$seeds"); do
    "$tessel" train "examples/$model.toml" --quiet --run-dir "$out/$model.$seed" \
      --set train.max_steps="$steps" --set seed="$seed" --set checkpoint.every_epochs=0 >/dev/null
  done
done
/usr/bin/python3 - "$out" "$seeds" "$steps" <<'PY'
import json, sys
out, seeds, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3]
loss = {}
for model in ("char_gpt", "char_gpt_modern"):
    runs = [json.load(open(f"{out}/{model}.{s}/summary.json")) for s in range(1, seeds + 1)]
    values = [r["test_loss"] for r in runs]
    loss[model] = sum(values) / len(values)
    print(f"{model:16s} {runs[0]['num_parameters']:>8d} parameters  test loss {loss[model]:.4f} "
          f"(range {min(values):.4f}..{max(values):.4f} over {seeds} seed(s), {steps} steps)")
print(f"modern - classic: {loss['char_gpt_modern'] - loss['char_gpt']:+.4f}")
PY
