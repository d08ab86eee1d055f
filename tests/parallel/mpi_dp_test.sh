#!/usr/bin/env bash
# Data parallel under mpirun (one rank per process):
#  1. deterministic mode gives the same params_sha256 on 1 rank and on 2, 3, 4 and 6 MPI ranks
#     (a batch of 24 rows in 12 micro-shards of 2), at every ZeRO stage on 2, 3 and 4 ranks;
#     and with zero.shard_size = 2 (2 shard groups of 2) at stages 1 and 3 on 4 ranks;
#  2. zero.stage 0 and 1 in an MPI shared-memory window equal the threads ones;
#  3. killing one rank's process ends the whole job, naming the lost rank, well within the
#     communication deadline (no hang).
# Usage: mpi_dp_test.sh TESSEL_BINARY SOURCE_DIR
source "$(dirname "$0")/../mpi_test_common.sh" "$@"
args=(train "$src/examples/spiral.toml" --quiet --set train.deterministic=true
      --set train.batch=24 --set train.drop_last=true --set ddp.micro_shard=2
      --set train.epochs=8 --set model.dropout=0.1)

"$tessel" "${args[@]}" --run-dir "$tmp/one" > /dev/null
for np in 2 3 4 6; do
  $mpirun -np $np "$tessel" "${args[@]}" --run-dir "$tmp/mpi$np" > "$tmp/out$np" 2>&1 ||
    { cat "$tmp/out$np"; exit 1; }
  if [ "$(sha "$tmp/one")" != "$(sha "$tmp/mpi$np")" ]; then
    echo "FAIL: params_sha256 differs between 1 rank and $np MPI ranks"; exit 1
  fi
  grep -q '"layout": "dp='$np'"' "$tmp/mpi$np/summary.json" || { echo "FAIL: layout"; exit 1; }
  echo "ok: deterministic mode, $np MPI ranks = 1 rank"
done
for stage in 1 2 3; do
  for np in 2 3 4; do
    $mpirun -np $np "$tessel" "${args[@]}" --set zero.stage=$stage --run-dir "$tmp/z$stage-$np" \
      > "$tmp/z.out" 2>&1 || { cat "$tmp/z.out"; exit 1; }
    if [ "$(sha "$tmp/one")" != "$(sha "$tmp/z$stage-$np")" ]; then
      echo "FAIL: params_sha256 differs between 1 rank and zero.stage=$stage on $np MPI ranks"; exit 1
    fi
  done
  echo "ok: deterministic mode, zero.stage=$stage on 2, 3 and 4 MPI ranks = 1 rank"
done
for stage in 1 3; do
  $mpirun -np 4 "$tessel" "${args[@]}" --set zero.stage=$stage --set zero.shard_size=2 \
    --run-dir "$tmp/g$stage" > "$tmp/g.out" 2>&1 || { cat "$tmp/g.out"; exit 1; }
  grep -q '"layout": "dp=4 shard=2"' "$tmp/g$stage/summary.json" || { echo "FAIL: layout"; exit 1; }
  [ "$(sha "$tmp/one")" = "$(sha "$tmp/g$stage")" ] ||
    { echo "FAIL: params_sha256 differs between 1 rank and zero.stage=$stage, 2 groups of 2 MPI ranks"; exit 1; }
done
echo "ok: deterministic mode, zero.shard_size=2 at zero.stage=1 and 3 on 4 MPI ranks = 1 rank"

# Among ranks of one host zero.stage 0 and 1 sum the gradients in an MPI shared-memory window:
# 2 MPI ranks give the same bits as 2 thread ranks (both sum each shard in rank order), and the
# message path (ddp.shared_memory=false) trains the same model.
acc() { grep -o '"test_accuracy": *[0-9.e-]*' "$1/summary.json" | grep -o '[0-9.e-]*$'; }
for stage in 0 1; do
  plain=(train "$src/examples/spiral.toml" --quiet --set train.epochs=4 --set zero.stage=$stage)
  "$tessel" "${plain[@]}" --workers 2 --run-dir "$tmp/threads2_$stage" > /dev/null
  $mpirun -np 2 "$tessel" "${plain[@]}" --run-dir "$tmp/shm2_$stage" > "$tmp/shm.out" 2>&1 ||
    { cat "$tmp/shm.out"; exit 1; }
  grep -q '"grad_sync": "shared_memory"' "$tmp/shm2_$stage/summary.json" ||
    { echo "FAIL: zero.stage=$stage, 2 MPI ranks on one host did not use shared memory"; exit 1; }
  if [ "$(sha "$tmp/threads2_$stage")" != "$(sha "$tmp/shm2_$stage")" ]; then
    echo "FAIL: zero.stage=$stage, params_sha256 differs between 2 thread ranks and 2 MPI ranks"
    exit 1
  fi
  $mpirun -np 2 "$tessel" "${plain[@]}" --set ddp.shared_memory=false \
    --run-dir "$tmp/msg2_$stage" > "$tmp/msg.out" 2>&1 || { cat "$tmp/msg.out"; exit 1; }
  want=$([ "$stage" = 0 ] && echo allreduce || echo reduce_scatter)
  grep -q "\"grad_sync\": \"$want\"" "$tmp/msg2_$stage/summary.json" ||
    { echo "FAIL: zero.stage=$stage by messages is not $want"; exit 1; }
  python3 - "$(acc "$tmp/shm2_$stage")" "$(acc "$tmp/msg2_$stage")" <<'EOP' ||
import sys
a, b = map(float, sys.argv[1:])
sys.exit(0 if abs(a - b) < 0.02 else 1)
EOP
    { echo "FAIL: zero.stage=$stage, accuracies differ"; exit 1; }
  echo "ok: zero.stage=$stage, 2 MPI ranks in shared memory = 2 threads; by messages: same accuracy"
done

# Rank 1 kills itself after 2 s of a long run; the job must end soon, naming the lost rank.
cat > "$tmp/victim.sh" <<EOS
#!/bin/sh
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ]; then (sleep 2; kill -9 \$\$) & fi
exec "$tessel" train "$src/examples/fashion_mlp.toml" --quiet --set train.epochs=50 \
  --set comm.timeout_s=30 --run-dir "$tmp/killed"
EOS
chmod +x "$tmp/victim.sh"
start=$(date +%s)
set +e
timeout 120 $mpirun -np 2 "$tmp/victim.sh" > "$tmp/killed.out" 2>&1
rc=$?
set -e
elapsed=$(( $(date +%s) - start ))
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
  cat "$tmp/killed.out"; echo "FAIL: killed job exited with $rc after ${elapsed}s"; exit 1
fi
if ! grep -qiE "rank 1|rank: 1|from rank 1|peer 1" "$tmp/killed.out"; then
  cat "$tmp/killed.out"; echo "FAIL: the output does not name the lost rank 1"; exit 1
fi
echo "ok: a killed rank ended the job in ${elapsed}s (exit $rc), naming rank 1"
echo "4 passed, 0 failed"
