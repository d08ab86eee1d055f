#!/usr/bin/env bash
# Everyday use under mpirun (one rank per process):
#  1. a run stopped by train.max_steps at 5 points of the first epoch and resumed with a larger
#     train.max_steps ends with the parameters of one uninterrupted run (params_sha256);
#  2. summary.json reports every rank's peak RSS;
#  3. tessel eval prints its result once, not once per rank;
#  4. the hostfile launch of docs/multihost.md, over TCP on the loopback interface as between
#     hosts, trains the same model as threads.
# Usage: mpi_everyday_test.sh TESSEL_BINARY SOURCE_DIR
source "$(dirname "$0")/../mpi_test_common.sh" "$@"
mpirun="$mpirun -np 2"
args=(train "$src/examples/spiral.toml" --quiet --set train.epochs=3 --set model.dropout=0.1
      --set schedule.kind=cosine --set optim.momentum=0.9)
mpi() { $mpirun "$tessel" "$@" > "$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }; }

mpi "${args[@]}" --set train.max_steps=17 --run-dir "$tmp/full"
for stop in 1 3 5 8 9; do
  mpi "${args[@]}" --set train.max_steps=$stop --run-dir "$tmp/part$stop"
  mpi "${args[@]}" --set train.max_steps=17 --run-dir "$tmp/part$stop" --resume "$tmp/part$stop"
  if [ "$(sha "$tmp/full")" != "$(sha "$tmp/part$stop")" ]; then
    echo "FAIL: stopped at step $stop and resumed under mpirun: params_sha256 differs"; exit 1
  fi
done
echo "ok: 2 MPI ranks, resumed after train.max_steps = 1, 3, 5, 8, 9 = one run of 17 steps"

python3 - "$tmp/full/summary.json" <<'EOP' || { echo "FAIL: peak RSS per rank"; exit 1; }
import json, sys
s = json.load(open(sys.argv[1]))
rss = s["peak_rss_bytes_per_rank"]
assert len(rss) == 2 and all(r > 1 << 20 for r in rss), rss
assert s["peak_rss_bytes"] == max(rss), s
assert s["train_seconds"] <= s["wall_seconds"], s
EOP
echo "ok: summary.json holds both ranks' peak RSS"

mpi eval "$src/examples/spiral.toml" --checkpoint "$tmp/full"
count=$(grep -c params_sha256 "$tmp/out" || true)
[ "$count" = 1 ] || { cat "$tmp/out"; echo "FAIL: eval printed $count results under mpirun"; exit 1; }
grep -q "$(sha "$tmp/full")" "$tmp/out" || { echo "FAIL: eval's params_sha256"; exit 1; }
echo "ok: eval under mpirun prints once"

printf 'localhost slots=2\n' > "$tmp/hostfile"
mpirun --allow-run-as-root --hostfile "$tmp/hostfile" -np 2 --mca btl tcp,self \
  --mca btl_tcp_if_include lo "$tessel" "${args[@]}" --set train.max_steps=17 --run-dir "$tmp/tcp" \
  > "$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
"$tessel" "${args[@]}" --set train.max_steps=17 --workers 2 --run-dir "$tmp/threads" > /dev/null
python3 - "$tmp/tcp/summary.json" "$tmp/threads/summary.json" <<'EOP' ||
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a["layout"] == b["layout"] == "dp=2", (a["layout"], b["layout"])
assert abs(a["train_loss"] - b["train_loss"]) < 1e-4, (a["train_loss"], b["train_loss"])
EOP
  { echo "FAIL: hostfile launch over TCP differs from threads"; exit 1; }
echo "ok: hostfile launch over TCP (loopback) trains as threads do"
