#!/usr/bin/env bash
# tessel vs PyTorch 1.13 training throughput, side by side in one run: the two alternate
# ROUNDS times (the machine is shared and noisy) and the medians and their ratio are printed.
#   bench/compare_torch.sh [BUILD_DIR] [ROUNDS] [THREADS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
threads=${3:-1}
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "compare_torch: PyTorch missing; run: apt-get install -y python3-torch" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
  "$build/bench/train_throughput" --threads "$threads" --json "$tmp/tessel_$r.json" > /dev/null
  # torch.set_num_threads does not bind Debian's OpenBLAS: pin it too, or "1 thread" uses both cores.
  OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY=PASSIVE \
    /usr/bin/python3 bench/torch_reference.py --threads "$threads" > "$tmp/torch_$r.jsonl"
  echo "round $r done" >&2
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for r in range(1, rounds + 1):
    for rec in json.load(open(f"{tmp}/tessel_{r}.json")):
        res.setdefault((rec["model"], "tessel"), []).append(rec["samples_per_second"])
    for line in open(f"{tmp}/torch_{r}.jsonl"):
        rec = json.loads(line)
        res.setdefault((rec["model"], "pytorch"), []).append(rec["samples_per_second"])
print(f"{'model':<12} {'tessel samples/s':>17} {'pytorch samples/s':>18} {'ratio':>7}")
for model in ("fashion_mlp", "fashion_cnn"):
    t = statistics.median(res[(model, "tessel")])
    p = statistics.median(res[(model, "pytorch")])
    print(f"{model:<12} {t:>17.0f} {p:>18.0f} {t / p:>6.2f}x")
PY
