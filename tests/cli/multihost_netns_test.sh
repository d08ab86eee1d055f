#!/usr/bin/env bash
# docs/multihost.md tried on two "hosts": two network namespaces of scripts/netns_cluster.sh,
# each with its own host name, and mpirun starting one rank in each through an rsh agent (in
# place of ssh) with a hostfile and --mca *_tcp_if_include naming their subnet. The run folder is on a file system
# both see, as on a cluster with shared storage. Checks:
#  1. deterministic training on the 2 hosts ends with the parameters of 1 rank (params_sha256),
#     and run.json names the host of rank 0;
#  2. zero.stage 1 across hosts exchanges messages (its shared-memory step needs one host);
#  3. a run stopped by train.max_steps on the 2 hosts resumes on them and equals one run.
# Needs root and network namespaces: skipped (exit 77) without them.
# Usage: multihost_netns_test.sh TESSEL_BINARY SOURCE_DIR
set -euo pipefail
tessel=$1
src=$2
# A cluster of its own (names and subnet), apart from a user's and from make test-multihost's.
export TESSEL_NETNS_PREFIX=tsleveryday- TESSEL_NETNS_SUBNET=10.213.78
cluster=$src/scripts/netns_cluster.sh
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null ||
   ! ip netns add "${TESSEL_NETNS_PREFIX}probe" 2> /dev/null; then
  echo "skipped: needs root, iproute2 and network namespaces"; exit 77
fi
ip netns del "${TESSEL_NETNS_PREFIX}probe"
tmp=$(mktemp -d)
trap '"$cluster" down > /dev/null; rm -rf "$tmp"' EXIT
"$cluster" up 2 > /dev/null
args=(train "$src/examples/spiral.toml" --quiet --set train.deterministic=true
      --set train.batch=24 --set train.drop_last=true --set ddp.micro_shard=2
      --set model.dropout=0.1 --set train.epochs=3)
sha() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["params_sha256"])' "$1/summary.json"; }
hosts() { timeout 120 "$cluster" mpirun -np 2 "$tessel" "$@" > "$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }; }

"$tessel" "${args[@]}" --set train.max_steps=30 --run-dir "$tmp/one" > /dev/null
hosts "${args[@]}" --set train.max_steps=30 --run-dir "$tmp/two"
[ "$(sha "$tmp/one")" = "$(sha "$tmp/two")" ] ||
  { echo "FAIL: 2 hosts differ from 1 rank"; exit 1; }
grep -q "\"host\": *\"${TESSEL_NETNS_PREFIX}h0\"" "$tmp/two/run.json" || { cat "$tmp/two/run.json"; echo "FAIL: run.json host"; exit 1; }
hosts train "$src/examples/spiral.toml" --quiet --set zero.stage=1 --set train.max_steps=5 --run-dir "$tmp/z1"
grep -q "\"grad_sync\": *\"reduce_scatter\"" "$tmp/z1/summary.json" ||
  { echo "FAIL: zero.stage 1 across hosts did not exchange messages"; exit 1; }
echo "ok: 2 namespace hosts (deterministic) = 1 rank; zero.stage 1 exchanges messages between them"

hosts "${args[@]}" --set train.max_steps=13 --run-dir "$tmp/part"
hosts "${args[@]}" --set train.max_steps=30 --run-dir "$tmp/part" --resume "$tmp/part"
[ "$(sha "$tmp/one")" = "$(sha "$tmp/part")" ] ||
  { echo "FAIL: stopped at 13 steps and resumed on 2 hosts: differs from one run"; exit 1; }
echo "ok: stopped by train.max_steps and resumed on 2 namespace hosts = one run"
