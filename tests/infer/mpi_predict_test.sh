#!/usr/bin/env bash
# tessel predict under mpirun (one rank per process):
#  1. 2 MPI ranks write the bytes of 1 worker, and 2 ranks of a tensor-parallel group (tp.size
#     = 2) those of 2 threads of one;
#  2. a job whose rank 1 is killed (SIGKILL) after 3 chunks, then run again with --resume,
#     writes the same bytes, resuming after the chunks it had committed;
#  3. predict restarts itself on a huge-page heap (where the kernel gives transparent huge pages
#     on request) and writes the bytes of a run told not to (GLIBC_TUNABLES set by the user).
# Usage: mpi_predict_test.sh TESSEL_BINARY SOURCE_DIR
source "$(dirname "$0")/../mpi_test_common.sh" "$@"
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
"$tessel" "${predict[@]}" --output "$tmp/tp_threads.jsonl" --workers 2 --set tp.size=2 > /dev/null
$mpirun -np 2 "$tessel" "${predict[@]}" --output "$tmp/tp_mpi.jsonl" --set tp.size=2 \
  > "$tmp/tp.out" 2>&1 || { cat "$tmp/tp.out"; exit 1; }
cmp "$tmp/tp_threads.jsonl" "$tmp/tp_mpi.jsonl" || { echo "FAIL: tp = 2 under MPI differs"; exit 1; }
grep -q '"huge_page_bytes"' "$tmp/tp.out" || { echo "FAIL: the MPI summary has no huge_page_bytes"; exit 1; }
[ "$(wc -l < "$tmp/tp_mpi.jsonl")" -eq "$(wc -l < "$tmp/one.jsonl")" ] ||
  { echo "FAIL: tp = 2 wrote another number of rows"; exit 1; }
echo "ok: tp = 2 on 2 MPI ranks = on 2 threads"

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
"$tessel" "${predict[@]}" --output "$tmp/huge.jsonl" > "$tmp/huge.out"
GLIBC_TUNABLES=glibc.malloc.hugetlb=0 "$tessel" "${predict[@]}" --output "$tmp/small.jsonl" \
  > "$tmp/small.out"
cmp "$tmp/huge.jsonl" "$tmp/small.jsonl" || { echo "FAIL: huge-page heap changed the output"; exit 1; }
huge=$(grep -o '"huge_page_bytes": [0-9]*' "$tmp/huge.out" | grep -o '[0-9]*$')
small=$(grep -o '"huge_page_bytes": [0-9]*' "$tmp/small.out" | grep -o '[0-9]*$')
[ "$small" -eq 0 ] || { echo "FAIL: hugetlb=0 still ran on $small bytes of huge pages"; exit 1; }
if grep -q '\[never\]' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null; then
  echo "ok: same bytes (transparent huge pages are off on this kernel)"
else
  [ "$huge" -gt 0 ] || { echo "FAIL: no huge pages in the default predict"; cat "$tmp/huge.out"; exit 1; }
  echo "ok: huge-page heap ($huge bytes) writes the bytes of a 4 KiB-page heap"
fi
echo "3 passed, 0 failed"
