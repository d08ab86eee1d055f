#!/usr/bin/env bash
# Training across "hosts" made of network namespaces (scripts/netns_cluster.sh), one MPI rank per
# namespace over TCP:
#  1. every rank runs on a host of its own (distinct hostname and address);
#  2. `tessel bench comm` verifies every collective and algorithm across 2 and 4 hosts;
#  3. fashion_mlp in deterministic mode gives the same params_sha256 across 2 and 4 hosts as the
#     same layout run as threads of one process;
#  4. a shaped link (1 Gbit/s) is really that slow: a 4 MiB allreduce cannot beat the rate;
#  5. --delay works, or fails clearly (kernel without netem) leaving nothing behind;
#  6. compressed gradients (powersgd, topk) across 2 hosts over 100 Mbit/s links: the bytes the
#     MPI transport counted are within 5% of the codec's formula, and the steps are faster
#     than uncompressed ones on the same links;
#  7. 2 hosts x 2 ranks over 1 Gbit/s links: ZeRO-3 in 2 shard groups of 2 (zero.shard_size = 2,
#     a group per host) gives 4 threads' params_sha256 in deterministic mode, and moves fewer
#     bytes over the inter-host link (its veth's counters) than plain ZeRO-3 over the 4 ranks.
# Needs root for ip netns; exits 77 (skipped) with the reason where namespaces cannot be made.
# Usage: multihost_netns_test.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
src=$2
skip() { echo "SKIP multihost: $*"; exit 77; }

# A cluster of its own (names and subnet), so that a user's cluster is left alone.
export TESSEL_NETNS_PREFIX=tsltest- TESSEL_NETNS_SUBNET=10.213.77
cluster=$src/scripts/netns_cluster.sh
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (ip netns); run as root"
command -v ip > /dev/null && command -v tc > /dev/null || skip "needs ip and tc (apt-get install iproute2)"
command -v mpirun > /dev/null || skip "needs mpirun (apt-get install openmpi-bin)"
probe=${TESSEL_NETNS_PREFIX}probe
ip netns add "$probe" 2> /dev/null || skip "cannot create network namespaces here (ip netns add failed)"
ip netns del "$probe"

tmp=$(mktemp -d)
trap '"$cluster" down; rm -rf "$tmp"' EXIT
sha() { grep -o '"params_sha256": *"[0-9a-f]*"' "$1/summary.json" | grep -o '[0-9a-f]\{64\}'; }
train=(train "$src/examples/fashion_mlp.toml" --quiet --set train.deterministic=true
       --set train.drop_last=true --set train.batch=64 --set ddp.micro_shard=16
       --set train.max_steps=12 --set train.epochs=1 --set comm.timeout_s=60)

for n in 2 4; do
  "$cluster" up "$n" > /dev/null
  hosts=$("$cluster" mpirun -np "$n" sh -c 'echo "$(hostname) $(ip -4 -o addr show eth0 | awk "{print \$4}")"' |
    sort -u | wc -l)
  [ "$hosts" = "$n" ] || { echo "FAIL: $n ranks ran on $hosts distinct hosts, want $n"; exit 1; }
  echo "ok: $n ranks on $n namespace hosts"

  "$cluster" mpirun -np "$n" "$tessel" bench comm --backend mpi --sizes 4KiB,1MiB \
    --collective allreduce,reduce_scatter,allgather --algorithm ring,hd,tree,native --repeats 2 \
    > "$tmp/bench$n.out" 2>&1 || { cat "$tmp/bench$n.out"; echo "FAIL: bench comm on $n hosts"; exit 1; }
  grep -q "backend mpi, $n ranks" "$tmp/bench$n.out" || { cat "$tmp/bench$n.out"; exit 1; }
  echo "ok: bench comm verified every collective across $n hosts"

  "$tessel" "${train[@]}" --workers "$n" --run-dir "$tmp/threads$n" > /dev/null
  "$cluster" mpirun -np "$n" "$tessel" "${train[@]}" --run-dir "$tmp/hosts$n" > "$tmp/train$n.out" 2>&1 ||
    { cat "$tmp/train$n.out"; echo "FAIL: training across $n hosts"; exit 1; }
  grep -q '"layout": "dp='$n'"' "$tmp/hosts$n/summary.json" || { echo "FAIL: layout"; exit 1; }
  [ "$(sha "$tmp/threads$n")" = "$(sha "$tmp/hosts$n")" ] ||
    { echo "FAIL: params_sha256 differs between $n hosts and $n threads"; exit 1; }
  echo "ok: fashion_mlp, deterministic, $n namespace hosts = $n threads"
done

# 4 MiB all-reduced by 2 ranks sends 4 MiB each way: at least 33.5 ms at 1 Gbit/s.
"$cluster" up 2 --rate 1gbit > /dev/null
"$cluster" mpirun -np 2 "$tessel" bench comm --backend mpi --sizes 4MiB --algorithm ring \
  --repeats 3 --json "$tmp/shaped.json" > "$tmp/shaped.out" 2>&1 || { cat "$tmp/shaped.out"; exit 1; }
python3 - "$tmp/shaped.json" <<'EOP' || { cat "$tmp/shaped.out"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
floor_us = 4 * 2**20 * 8 / 1e9 * 1e6
if not r["ok"] or r["median_us"] < floor_us:
    sys.exit(f"FAIL: 4 MiB allreduce over 1 Gbit/s links took {r['median_us']:.0f} us, "
             f"faster than the wire allows ({floor_us:.0f} us): shaping is not applied")
print(f"ok: shaped 1 Gbit/s link: 4 MiB allreduce {r['median_us'] / 1e3:.1f} ms "
      f"(wire floor {floor_us / 1e3:.1f} ms)")
EOP

# Compression across 2 hosts over 100 Mbit/s: measured bytes = formula, steps faster than f32.
"$cluster" up 2 --rate 100mbit > /dev/null
for kind in none powersgd topk; do
  "$cluster" mpirun -np 2 "$tessel" train "$src/examples/fashion_mlp.toml" --quiet \
    --set compress.kind=$kind --set train.max_steps=12 --set checkpoint.every_epochs=0 \
    --set comm.timeout_s=60 --run-dir "$tmp/compress_$kind" > "$tmp/compress.out" 2>&1 ||
    { cat "$tmp/compress.out"; echo "FAIL: compress.kind=$kind across 2 hosts"; exit 1; }
done
python3 - "$tmp" <<'EOP'
import json, sys
s = {k: json.load(open(f"{sys.argv[1]}/compress_{k}/summary.json")) for k in ("none", "powersgd", "topk")}
step = {k: v["train_seconds"] / v["steps"] for k, v in s.items()}
for k in ("powersgd", "topk"):
    c = s[k]["compress"]
    if abs(c["bytes_per_step"] - c["formula_bytes_per_step"]) > 0.05 * c["formula_bytes_per_step"]:
        sys.exit(f"FAIL: {k} sent {c['bytes_per_step']:.0f} bytes per step, formula {c['formula_bytes_per_step']:.0f}")
    if step[k] >= step["none"]:
        sys.exit(f"FAIL: {k} steps ({1e3 * step[k]:.0f} ms) not faster than f32 ({1e3 * step['none']:.0f} ms) at 100 Mbit/s")
    print(f"ok: {k} across 2 hosts at 100 Mbit/s: {c['bytes_per_step']:.0f} bytes per step (formula "
          f"{c['formula_bytes_per_step']:.0f}), {1e3 * step[k]:.0f} ms per step against {1e3 * step['none']:.0f} ms f32")
EOP

# 2 hosts x 2 ranks, consecutive ranks on one host; zero.shard_size = 2 makes each host a group.
"$cluster" up 2 --rate 1gbit > /dev/null
export TESSEL_NETNS_SLOTS=2
placed=$("$cluster" mpirun -np 4 sh -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname)"' | sort | tr '\n' ' ')
[ "$placed" = "0 ${TESSEL_NETNS_PREFIX}h0 1 ${TESSEL_NETNS_PREFIX}h0 2 ${TESSEL_NETNS_PREFIX}h1 3 ${TESSEL_NETNS_PREFIX}h1 " ] ||
  { echo "FAIL: 4 ranks on 2 hosts placed as: $placed"; exit 1; }
groups=("${train[@]}" --set zero.stage=3 --set zero.shard_size=2)
"$tessel" "${groups[@]}" --workers 4 --run-dir "$tmp/groups-threads" > /dev/null
"$cluster" mpirun -np 4 "$tessel" "${groups[@]}" --run-dir "$tmp/groups-hosts" > "$tmp/groups.out" 2>&1 ||
  { cat "$tmp/groups.out"; echo "FAIL: zero.shard_size=2 on 2 hosts x 2 ranks"; exit 1; }
grep -q '"layout": "dp=4 shard=2"' "$tmp/groups-hosts/summary.json" || { echo "FAIL: layout"; exit 1; }
[ "$(sha "$tmp/groups-threads")" = "$(sha "$tmp/groups-hosts")" ] ||
  { echo "FAIL: zero.shard_size=2, 2 hosts x 2 ranks differ from 4 threads"; exit 1; }
echo "ok: zero.stage=3 in shard groups of 2, deterministic, 2 namespace hosts x 2 ranks = 4 threads"
link() {  # bytes both ways through host 0's link so far
  local d=/sys/class/net/${TESSEL_NETNS_PREFIX}v0/statistics
  echo $(($(cat $d/tx_bytes) + $(cat $d/rx_bytes)))
}
for k in 0 2; do
  before=$(link)
  "$cluster" mpirun -np 4 "$tessel" train "$src/examples/fashion_mlp.toml" --quiet --set zero.stage=3 \
    --set zero.shard_size=$k --set train.max_steps=12 --set checkpoint.every_epochs=0 \
    --set comm.timeout_s=60 --run-dir "$tmp/link$k" > "$tmp/link.out" 2>&1 ||
    { cat "$tmp/link.out"; echo "FAIL: zero.shard_size=$k on 2 hosts x 2 ranks"; exit 1; }
  eval "link$k=$(($(link) - before))"
done
[ "$link2" -lt "$link0" ] ||
  { echo "FAIL: zero.shard_size=2 moved $link2 bytes over the link, plain ZeRO-3 $link0"; exit 1; }
echo "ok: over the inter-host link: $link2 bytes with zero.shard_size=2 against $link0 plain (12 steps)"
unset TESSEL_NETNS_SLOTS

# --delay needs netem; where the kernel lacks it, up must say so and leave nothing behind.
if ! "$cluster" up 2 --rate 100mbit --delay 1ms > "$tmp/delay.out" 2>&1; then
  grep -q "netem" "$tmp/delay.out" || { cat "$tmp/delay.out"; echo "FAIL: unclear --delay error"; exit 1; }
  [ -z "$(ip netns list | grep "^${TESSEL_NETNS_PREFIX}")" ] || { echo "FAIL: failed up left namespaces"; exit 1; }
  echo "ok: --delay without netem in this kernel: clear error, nothing left behind"
else
  echo "ok: --delay applied (netem)"
fi
echo "12 passed, 0 failed"
