#!/usr/bin/env bash
# Pipeline and parameter-server layouts under mpirun (one rank per process):
#  1. a dp 2 x pp 2 pipeline and a sync parameter server (1 server x 2 workers) in
#     deterministic mode give one rank's params_sha256;
#  2. a pp 2 pipeline (1f1b, interleaved with 2 chunks per stage, zb-h1) and a sync parameter
#     server (1 server x 2 workers) give the same params_sha256 as the same layout run as
#     threads of one process;
#  3. async and ssp parameter servers (1 server x 2 workers) hand out every batch exactly once;
#  4. dp 2 x pp 2 x tp 2 (sequence parallel) on char_gpt: 8 MPI ranks = 8 threads.
# Usage: mpi_layouts_test.sh TESSEL_BINARY SOURCE_DIR
source "$(dirname "$0")/../mpi_test_common.sh" "$@"
base=(train "$src/examples/spiral.toml" --quiet --set train.epochs=4 --set model.dropout=0.1)
layout() { grep -o '"layout": *"[^"]*"' "$1/summary.json" | cut -d'"' -f4; }

det=(--set train.deterministic=true --set train.batch=24 --set train.drop_last=true
     --set ddp.micro_shard=2)
"$tessel" "${base[@]}" "${det[@]}" --run-dir "$tmp/one" > /dev/null
$mpirun -np 4 "$tessel" "${base[@]}" "${det[@]}" --set pp.stages=2 --run-dir "$tmp/dpxpp" \
  > "$tmp/dpxpp.out" 2>&1 || { cat "$tmp/dpxpp.out"; exit 1; }
[ "$(layout "$tmp/dpxpp")" = "dp=2 pp=2" ] || { echo "FAIL: layout $(layout "$tmp/dpxpp")"; exit 1; }
[ "$(sha "$tmp/one")" = "$(sha "$tmp/dpxpp")" ] ||
  { echo "FAIL: deterministic dp 2 x pp 2 under mpirun differs from 1 rank"; exit 1; }
echo "ok: deterministic dp 2 x pp 2, 4 MPI ranks = 1 rank"
$mpirun -np 3 "$tessel" "${base[@]}" "${det[@]}" --set ps.servers=1 --run-dir "$tmp/ps_det" \
  > "$tmp/ps_det.out" 2>&1 || { cat "$tmp/ps_det.out"; exit 1; }
[ "$(sha "$tmp/one")" = "$(sha "$tmp/ps_det")" ] ||
  { echo "FAIL: deterministic parameter server under mpirun differs from 1 rank"; exit 1; }
echo "ok: deterministic parameter server 1 x 2, 3 MPI ranks = 1 rank"

check_same() {  # name, np, extra args...
  local name=$1 np=$2
  shift 2
  "$tessel" "${base[@]}" "$@" --workers "$np" --run-dir "$tmp/$name-threads" > /dev/null
  $mpirun -np "$np" "$tessel" "${base[@]}" "$@" --run-dir "$tmp/$name-mpi" > "$tmp/$name.out" 2>&1 ||
    { cat "$tmp/$name.out"; exit 1; }
  [ "$(sha "$tmp/$name-threads")" = "$(sha "$tmp/$name-mpi")" ] ||
    { echo "FAIL: $name under mpirun differs from threads"; exit 1; }
  echo "ok: $name, $np MPI ranks = $np threads ($(layout "$tmp/$name-mpi"))"
}
check_same pipeline 2 --set pp.stages=2 --set pp.microbatches=3
check_same interleaved 2 --set pp.stages=2 --set train.batch=32 --set pp.microbatches=4 \
  --set pp.schedule=interleaved --set pp.virtual_stages=2
check_same zb-h1 2 --set pp.stages=2 --set train.batch=32 --set pp.microbatches=4 \
  --set pp.schedule=zb-h1
check_same ps_sync 3 --set ps.servers=1 --set ps.mode=sync --set optim.lr=0.1
for mode in async ssp; do
  $mpirun -np 3 "$tessel" train "$src/examples/spiral_ps.toml" --quiet --set ps.mode=$mode \
    --set train.epochs=20 --run-dir "$tmp/$mode" > "$tmp/$mode.out" 2>&1 || { cat "$tmp/$mode.out"; exit 1; }
  # 300 samples in worker batches of 32 / 2 = 16 rows: 19 batches an epoch.
  python3 - "$tmp/$mode/summary.json" <<'PY' || exit 1
import json, sys
s = json.load(open(sys.argv[1]))
got = sum(s["ranks"]["ps_worker_batches"])
if not s["completed"] or got != 20 * 19:
    sys.exit(f"FAIL: {s['layout']} trained {got} worker batches, want 380")
PY
  echo "ok: $mode parameter server, 3 MPI ranks: every batch trained once"
done
gpt=(train "$src/examples/char_gpt.toml" --quiet --set train.max_steps=6 --set data.context=16
     --set model.embed=32 --set train.batch=8 --set tp.size=2 --set tp.sequence_parallel=true
     --set pp.stages=2)
"$tessel" "${gpt[@]}" --workers 8 --run-dir "$tmp/3d-threads" > /dev/null
$mpirun -np 8 "$tessel" "${gpt[@]}" --run-dir "$tmp/3d-mpi" > "$tmp/3d.out" 2>&1 ||
  { cat "$tmp/3d.out"; exit 1; }
[ "$(layout "$tmp/3d-mpi")" = "dp=2 pp=2 tp=2" ] || { echo "FAIL: layout $(layout "$tmp/3d-mpi")"; exit 1; }
[ "$(sha "$tmp/3d-threads")" = "$(sha "$tmp/3d-mpi")" ] ||
  { echo "FAIL: dp 2 x pp 2 x tp 2 under mpirun differs from threads"; exit 1; }
echo "ok: dp 2 x pp 2 x tp 2, 8 MPI ranks = 8 threads"
echo "8 passed, 0 failed"
