#!/usr/bin/env bash
# ddp.balance under mpirun (one rank per process): deterministic mode with ddp.balance = dynamic
# and rank 1 slowed 4x (debug.slow_factor) gives the same params_sha256 as one rank on 2, 3 and
# 4 MPI ranks, and the deal gives rank 1 fewer micro-shards than rank 0 (the test fails if
# balancing does nothing).
# Usage: mpi_balance_test.sh TESSEL_BINARY SOURCE_DIR
source "$(dirname "$0")/../mpi_test_common.sh" "$@"
args=(train "$src/examples/spiral.toml" --quiet --set train.deterministic=true
      --set train.batch=24 --set train.drop_last=true --set ddp.micro_shard=2
      --set train.epochs=4 --set model.dropout=0.1 --set train.eval_train=false)

"$tessel" "${args[@]}" --run-dir "$tmp/one" > /dev/null
for np in 2 3 4; do
  $mpirun -np $np "$tessel" "${args[@]}" --set ddp.balance=dynamic --set debug.slow_rank=1 \
    --set debug.slow_factor=4 --run-dir "$tmp/mpi$np" > "$tmp/out$np" 2>&1 ||
    { cat "$tmp/out$np"; exit 1; }
  if [ "$(sha "$tmp/one")" != "$(sha "$tmp/mpi$np")" ]; then
    echo "FAIL: params_sha256 differs between 1 rank and $np MPI ranks with ddp.balance=dynamic"
    exit 1
  fi
  python3 - "$tmp/mpi$np/summary.json" <<'EOP' || exit 1
import json, sys
b = json.load(open(sys.argv[1]))["balance"]
deal = b["shards_per_rank"]
if not deal[1] < deal[0]:
    sys.exit(f"FAIL: the deal {deal} did not move micro-shards off the slow rank 1: {b}")
EOP
  echo "ok: ddp.balance=dynamic, $np MPI ranks with a slow rank = 1 rank; deal $(python3 -c \
    "import json; print(json.load(open('$tmp/mpi$np/summary.json'))['balance']['shards_per_rank'])")"
done
