#!/usr/bin/env bash
# tessel vs PyTorch 1.13 training throughput, side by side in one run.
#   bench/compare_torch.sh [BUILD_DIR] [ROUNDS] [THREADS] [MODELS] [STEPS]
# MODELS: comma-separated, default fashion_mlp,fashion_cnn,char_gpt; STEPS: timed steps per
# repeat (default 100; char_gpt's steps are slow in PyTorch, 10-20 keeps a round short).
# Each round runs, back to back: tessel (BUILD_DIR/bench/train_throughput), PyTorch as
# installed, and PyTorch with glibc told to keep the memory it frees (the reference VM reclaims
# freed memory aggressively, and PyTorch's CNN otherwise spends its time in page faults). The
# two PyTorch runs swap places every round. The machine is shared and noisy, so every figure is
# printed as the median over the rounds with its min and max, and the headline ratio is tessel's
# median over the median of whichever PyTorch setting was faster (with the range of the
# per-round ratios against that setting).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
threads=${3:-1}
models=${4:-fashion_mlp,fashion_cnn,char_gpt}
steps=${5:-100}
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "compare_torch: PyTorch missing; run: apt-get install -y python3-torch" >&2
  exit 1
fi
if [[ ! -x "$build/bench/train_throughput" ]]; then
  echo "compare_torch: $build/bench/train_throughput missing; build it first:" \
    "cmake --build $build --target train_throughput" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# torch.set_num_threads does not bind Debian's OpenBLAS: pin it too, or "1 thread" uses both cores.
torch_run() {  # torch_run OUT [ENV=VALUE ...]
  local out=$1
  shift
  env "$@" OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY=PASSIVE \
    /usr/bin/python3 bench/torch_reference.py --threads "$threads" --models "$models" \
    --steps "$steps" > "$out"
}
keep_memory=(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296
  MALLOC_TOP_PAD_=268435456)

for r in $(seq "$rounds"); do
  "$build/bench/train_throughput" --threads "$threads" --models "$models" --steps "$steps" \
    --json "$tmp/tessel_$r.json" > /dev/null
  if (( r % 2 == 1 )); then
    torch_run "$tmp/torch_$r.jsonl"
    torch_run "$tmp/torch_malloc_$r.jsonl" "${keep_memory[@]}"
  else
    torch_run "$tmp/torch_malloc_$r.jsonl" "${keep_memory[@]}"
    torch_run "$tmp/torch_$r.jsonl"
  fi
  echo "round $r of $rounds done" >&2
done

/usr/bin/python3 - "$tmp" "$rounds" "$threads" "$models" <<'PY'
import json, statistics, sys

tmp, rounds, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
models = sys.argv[4].split(",")
IMPLS = [("tessel", "tessel"), ("pytorch", "pytorch as installed"),
         ("pytorch_malloc", "pytorch, glibc keeps freed memory")]
rate, gflops, peak = {}, {}, []  # (model, impl) -> per-round samples/s; model -> tessel GFLOP/s
for r in range(1, rounds + 1):
    for rec in json.load(open(f"{tmp}/tessel_{r}.json")):
        rate.setdefault((rec["model"], "tessel"), []).append(rec["samples_per_second"])
        gflops.setdefault(rec["model"], []).append(rec["gflops"])
        peak.append(rec["fma_peak_gflops"])
    for impl, name in (("pytorch", "torch"), ("pytorch_malloc", "torch_malloc")):
        for line in open(f"{tmp}/{name}_{r}.jsonl"):
            rec = json.loads(line)
            rate.setdefault((rec["model"], impl), []).append(rec["samples_per_second"])

med = statistics.median
print(f"compare_torch: {rounds} alternating rounds, {threads} thread(s); "
      f"fp32 FMA peak {med(peak):.1f} GFLOP/s ({min(peak):.1f}-{max(peak):.1f}), "
      f"{threads} core(s), measured by train_throughput in each round")
print(f"{'model':<12} {'':<34} {'median':>9} {'min':>9} {'max':>9}  samples/s")
for model in models:
    for impl, label in IMPLS:
        v = rate[(model, impl)]
        print(f"{model:<12} {label:<34} {med(v):>9.0f} {min(v):>9.0f} {max(v):>9.0f}")
    faster = max(("pytorch", "pytorch_malloc"), key=lambda i: med(rate[(model, i)]))
    t, p = rate[(model, "tessel")], rate[(model, faster)]
    per_round = [a / b for a, b in zip(t, p)]
    label = dict(IMPLS)[faster]
    print(f"{model:<12} tessel / faster pytorch ({label}): {med(t) / med(p):.2f}x "
          f"(per round {min(per_round):.2f}x-{max(per_round):.2f}x)")
    g = gflops[model]
    print(f"{model:<12} tessel {med(g):.1f} GFLOP/s ({min(g):.1f}-{max(g):.1f}), "
          f"{100 * med(g) / med(peak):.0f}% of the FMA peak")
PY
