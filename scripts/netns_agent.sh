#!/usr/bin/env bash
# OpenMPI's remote-shell agent for the namespace cluster (plm_rsh_agent; see netns_cluster.sh):
# called as `netns_agent.sh [-x] HOST COMMAND...` like ssh, it runs COMMAND with `ip netns exec`
# in the network namespace that owns HOST's address, under its own hostname (a private UTS
# namespace), so that every namespace is a host of its own to OpenMPI.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh options such as -x
[ $# -ge 2 ] || { echo "netns_agent: usage: netns_agent.sh HOST COMMAND..." >&2; exit 2; }
host=$1
shift
for ns in $(ip netns list | awk '{print $1}'); do
  if ip -n "$ns" -o -4 addr show | grep -q " inet $host/"; then
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1"; shift; eval "$*"' sh "$ns" "$*"
  fi
done
echo "netns_agent: no network namespace owns address '$host'; run scripts/netns_cluster.sh up N" >&2
exit 255
