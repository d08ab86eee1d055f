#!/usr/bin/env bash
# tessel predict under mpirun (one rank per process):
#  1. 2 MPI ranks write the bytes of 1 worker;
#  2. a job whose rank 1 is killed (SIGKILL) after 3 chunks, then run again with --resume,
#     writes the same bytes, resuming after the chunks it had committed.
# Usage: mpi_predict_test.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpirun="mpirun --allow-run-as-root --oversubscribe"
cfg=(--set model.hidden=[64] --set train.max_steps=3 --set infer.chunk_rows=500
     --set infer.commit_every_s=0)
"$tessel" train "$src/examples/fashion_mlp.toml" --quiet "${cfg[@]}" --run-dir "$tmp/run" > /dev/null
predict=(predict "$src/examples/fashion_mlp.toml" "${cfg[@]}" --checkpoint "$tmp/run"
         --input /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz)

"$tessel" "${predict[@]}" --output "$tmp/one.jsonl" > /dev/null
$mpirun -np 2 "$tessel" "${predict[@]}" --output "$tmp/mpi.jsonl" > "$tmp/mpi.out" 2>&1 ||
  { cat "$tmp/mpi.out"; exit 1; }
cmp "$tmp/one.jsonl" "$tmp/mpi.jsonl" || { echo "FAIL: 2 MPI ranks differ from 1 worker"; exit 1; }
echo "ok: 2 MPI ranks = 1 worker ($(wc -l < "$tmp/one.jsonl") rows)"

if $mpirun -np 2 "$tessel" "${predict[@]}" --output "$tmp/resumed.jsonl" \
    --set debug.kill_rank=1 --set debug.kill_after=3 > "$tmp/killed.out" 2>&1; then
  echo "FAIL: the job with a killed rank succeeded"; cat "$tmp/killed.out"; exit 1
fi
$mpirun -np 2 "$tessel" "${predict[@]}" --output "$tmp/resumed.jsonl" --resume \
  > "$tmp/resume.out" 2>&1 || { cat "$tmp/resume.out"; exit 1; }
at=$(grep -o '"resumed_at_chunk": [0-9]*' "$tmp/resume.out" | grep -o '[0-9]*$')
[ "$at" -gt 0 ] || { echo "FAIL: resumed at chunk $at"; cat "$tmp/resume.out"; exit 1; }
cmp "$tmp/one.jsonl" "$tmp/resumed.jsonl" || { echo "FAIL: killed + resumed differs"; exit 1; }
echo "ok: killed after 3 chunks of rank 1, resumed at chunk $at: same bytes"
echo "2 passed, 0 failed"
