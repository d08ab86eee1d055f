#!/usr/bin/env bash
# tessel vs PyTorch training throughput, side by side in one run.
#   [ISA=avx2] [TORCH2=1] bench/compare_torch.sh [BUILD_DIR] [ROUNDS] [THREADS] [MODELS] [STEPS]
# MODELS: comma-separated, default fashion_mlp,fashion_cnn,char_gpt; STEPS: timed steps per
# repeat (default 100; char_gpt's steps are slow in PyTorch, 10-20 keeps a round short).
# The peers: Debian's PyTorch 1.13 always; with TORCH2=1 also PyTorch 2.x from PyPI, eager and
# torch.compile'd (bench/torch2_venv.sh makes its venv once). ISA=portable|avx2|avx512|
# avx512_bf16 holds every side to that level: tessel through TESSEL_ISA, PyTorch through
# ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA and OPENBLAS_CORETYPE (default: the host's level).
# Each round runs, back to back: tessel (BUILD_DIR/bench/train_throughput), then each peer as
# installed and with glibc told to keep the memory it frees (the reference VM reclaims freed
# memory aggressively, and PyTorch's CNN otherwise spends its time in page faults); the peers
# and the two settings swap places every round. The machine is shared and noisy, so every figure
# is printed as the median over the rounds with its min and max; each peer's ratio is tessel's
# median over the median of that peer's faster setting (with the range of the per-round ratios),
# and the headline is the ratio against the fastest of them.
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
held=()  # the environment that holds every side to ISA
case "${ISA:-}" in
  "") ;;
  portable) held=(TESSEL_ISA=portable ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41
                  OPENBLAS_CORETYPE=Prescott) ;;
  avx2) held=(TESSEL_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
              OPENBLAS_CORETYPE=Haswell) ;;
  avx512) held=(TESSEL_ISA=avx512 ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE
                OPENBLAS_CORETYPE=SkylakeX) ;;
  avx512_bf16) held=(TESSEL_ISA=avx512_bf16 ATEN_CPU_CAPABILITY=avx512
                     ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 OPENBLAS_CORETYPE=Cooperlake) ;;
  *) echo "compare_torch: ISA must be portable, avx2, avx512 or avx512_bf16, got '$ISA'" >&2
     exit 1 ;;
esac
peers=("pytorch|/usr/bin/python3|")  # name|python|extra arguments
if [[ "${TORCH2:-0}" == 1 ]]; then
  py2=$(bench/torch2_venv.sh)
  peers+=("pytorch2|$py2|" "pytorch2_compile|$py2|--compile")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# torch.set_num_threads does not bind Debian's OpenBLAS: pin it too, or "1 thread" uses both cores.
keep_memory=(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296
  MALLOC_TOP_PAD_=268435456)
torch_run() {  # torch_run PEER SETTING ROUND
  local name python args
  IFS='|' read -r name python args <<< "$1"
  local extra=()
  [[ "$2" == malloc ]] && extra=("${keep_memory[@]}")
  # shellcheck disable=SC2086  # args: zero or more words
  env "${held[@]}" "${extra[@]}" OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads" \
    OMP_WAIT_POLICY=PASSIVE "$python" bench/torch_reference.py --threads "$threads" \
    --models "$models" --steps "$steps" $args > "$tmp/${name}_$2_$3.jsonl"
}

for r in $(seq "$rounds"); do
  env "${held[@]}" "$build/bench/train_throughput" --threads "$threads" --models "$models" \
    --steps "$steps" --json "$tmp/tessel_$r.json" > /dev/null
  order=("${peers[@]}")
  settings=(plain malloc)
  if (( r % 2 == 0 )); then
    order=(); for ((i = ${#peers[@]} - 1; i >= 0; --i)); do order+=("${peers[i]}"); done
    settings=(malloc plain)
  fi
  for peer in "${order[@]}"; do
    for setting in "${settings[@]}"; do torch_run "$peer" "$setting" "$r"; done
  done
  echo "round $r of $rounds done" >&2
done

peer_names=$(for p in "${peers[@]}"; do printf '%s,' "${p%%|*}"; done)
/usr/bin/python3 - "$tmp" "$rounds" "$threads" "$models" "${peer_names%,}" <<'PY'
import json, statistics, sys

tmp, rounds, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
models, peers = sys.argv[4].split(","), sys.argv[5].split(",")
rate, gflops, peak, isa, label = {}, {}, [], set(), {"tessel": "tessel"}
for r in range(1, rounds + 1):
    for rec in json.load(open(f"{tmp}/tessel_{r}.json")):
        rate.setdefault((rec["model"], "tessel"), []).append(rec["samples_per_second"])
        gflops.setdefault(rec["model"], []).append(rec["gflops"])
        peak.append(rec["fma_peak_gflops"])
        isa.add(rec.get("isa", "?"))
    for peer in peers:
        for setting in ("plain", "malloc"):
            for line in open(f"{tmp}/{peer}_{setting}_{r}.jsonl"):
                rec = json.loads(line)
                impl = (peer, setting)
                rate.setdefault((rec["model"], impl), []).append(rec["samples_per_second"])
                label[impl] = (f"pytorch {rec['version'].split('+')[0]} {rec.get('mode', 'eager')}"
                               + (", glibc keeps freed memory" if setting == "malloc" else ""))

med = statistics.median
print(f"compare_torch: {rounds} alternating rounds, {threads} thread(s), tessel at ISA level "
      f"{'/'.join(sorted(isa))}; fp32 FMA peak {med(peak):.1f} GFLOP/s "
      f"({min(peak):.1f}-{max(peak):.1f}), {threads} core(s), measured by train_throughput in "
      f"each round")
print(f"{'model':<12} {'':<50} {'median':>9} {'min':>9} {'max':>9}  samples/s")
impls = ["tessel"] + [(p, s) for p in peers for s in ("plain", "malloc")]
for model in models:
    for impl in impls:
        v = rate[(model, impl)]
        print(f"{model:<12} {label[impl]:<50} {med(v):>9.0f} {min(v):>9.0f} {max(v):>9.0f}")
    t = rate[(model, "tessel")]
    best = []
    for peer in peers:
        faster = max(((peer, "plain"), (peer, "malloc")), key=lambda i: med(rate[(model, i)]))
        best.append(faster)
        p = rate[(model, faster)]
        per_round = [a / b for a, b in zip(t, p)]
        print(f"{model:<12} tessel / {label[faster]}: {med(t) / med(p):.2f}x "
              f"(per round {min(per_round):.2f}x-{max(per_round):.2f}x)")
    fastest = max(best, key=lambda i: med(rate[(model, i)]))
    print(f"{model:<12} tessel / fastest pytorch ({label[fastest]}): "
          f"{med(t) / med(rate[(model, fastest)]):.2f}x")
    g = gflops[model]
    print(f"{model:<12} tessel {med(g):.1f} GFLOP/s ({min(g):.1f}-{max(g):.1f}), "
          f"{100 * med(g) / med(peak):.0f}% of the FMA peak")
PY
