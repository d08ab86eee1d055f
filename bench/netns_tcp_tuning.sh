#!/usr/bin/env bash
# OpenMPI TCP settings across 2 namespace hosts (scripts/netns_cluster.sh), unshaped: for each
# setting, `tessel bench comm` bus bandwidth of a 64 MiB allreduce (ring, halving-doubling),
# plus the raw TCP wire (iperf3, one way and both ways at once) at each MTU. Settings
# are run in alternating rounds; medians with min and max are printed. Needs root.
# Usage: bench/netns_tcp_tuning.sh TESSEL_BINARY [ROUNDS] [SETTING...]
#   a SETTING is "mtu=M name=NAME MCA-ARGS...", e.g. "mtu=1500 name=default"
set -euo pipefail
tessel=$(realpath "$1")
rounds=${2:-3}
shift $(($# >= 2 ? 2 : 1))
cluster=$(cd "$(dirname "$0")/.." && pwd)/scripts/netns_cluster.sh
settings=("$@")
net=${TESSEL_NETNS_SUBNET:-10.213.0}
if [ ${#settings[@]} -eq 0 ]; then
  settings=(
    "mtu=1500 name=mtu1500"
    "mtu=65535 name=mtu65535")
fi
out=$(mktemp -d)
trap '"$cluster" down; rm -rf "$out"' EXIT

# One stream one way, then one each way at once (two iperf3 pairs: iperf3 3.12 runs --bidir
# in one thread, which would measure one core).
wire() {  # mtu round
  "$cluster" exec 1 iperf3 -s -1 -D -B $net.2 -p 5201 > /dev/null
  sleep 0.3
  "$cluster" exec 0 iperf3 -c $net.2 -p 5201 -t 3 -J > "$out/wire-$1-$2.json"
  "$cluster" exec 1 iperf3 -s -1 -D -B $net.2 -p 5201 > /dev/null
  "$cluster" exec 0 iperf3 -s -1 -D -B $net.1 -p 5202 > /dev/null
  sleep 0.3
  "$cluster" exec 0 iperf3 -c $net.2 -p 5201 -t 3 -J > "$out/fwd-$1-$2.json" &
  "$cluster" exec 1 iperf3 -c $net.1 -p 5202 -t 3 -J > "$out/rev-$1-$2.json"
  wait
}

for ((r = 0; r < rounds; ++r)); do
  for s in "${settings[@]}"; do
    read -r mtu name args <<< "$s"
    mtu=${mtu#mtu=}
    name=${name#name=}
    "$cluster" up 2 --mtu "$mtu" > /dev/null
    [ -f "$out/wire-$mtu-$r.json" ] || wire "$mtu" "$r"
    # shellcheck disable=SC2086
    "$cluster" mpirun $args -np 2 "$tessel" bench comm --backend mpi --sizes 64MiB \
      --algorithm ring,hd --repeats 5 --json "$out/$name-$r.json" > "$out/$name-$r.out" 2>&1 ||
      { cat "$out/$name-$r.out"; exit 1; }
    echo "round $r: $name done" >&2
  done
done

python3 - "$out" "${settings[@]}" <<'EOP'
import glob, json, statistics, sys
out, settings = sys.argv[1], sys.argv[2:]
def fmt(v): return f"{statistics.median(v):6.2f} ({min(v):.2f}-{max(v):.2f})"
print("raw TCP, iperf3, Gbit/s per direction: median (min-max)")
for mtu in sorted({s.split()[0][4:] for s in settings}, key=int):
    one = [json.load(open(f))["end"]["sum_received"]["bits_per_second"] / 1e9
           for f in glob.glob(f"{out}/wire-{mtu}-*.json")]
    rx = lambda f: json.load(open(f))["end"]["sum_received"]["bits_per_second"] / 1e9
    both = [(rx(f) + rx(f.replace("/fwd-", "/rev-"))) / 2 for f in glob.glob(f"{out}/fwd-{mtu}-*.json")]
    print(f"  mtu {mtu:>5}: one way {fmt(one)}, both ways at once (mean of the "
          f"two) {fmt(both)} (= {statistics.median(both) / 8:.2f} GB/s)")
print("64 MiB allreduce, 2 hosts, bus bandwidth GB/s: median (min-max) over rounds")
print(f"  {'setting':<28} {'ring':>20} {'halving_doubling':>20}")
for s in settings:
    name = s.split()[1][5:]
    by = {}
    for f in glob.glob(f"{out}/{name}-*.json"):
        for p in json.load(open(f))["results"]:
            by.setdefault(p["algorithm"], []).append(p["busbw_GBps"])
    print(f"  {name:<28} " + " ".join(f"{fmt(by[a]):>20}" for a in
                                       ("ring", "halving_doubling")))
EOP
