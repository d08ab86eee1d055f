#!/usr/bin/env bash
# A multi-host test cluster on one machine: N network namespaces ("hosts") joined by veth pairs
# on a bridge, each with its own address, links optionally shaped with tc; and mpirun starting
# one rank per namespace over TCP. Needs root (ip netns). See docs/multihost_namespaces.md.
#
#   netns_cluster.sh up N [--rate R] [--delay D] [--mtu M]   create or reshape (idempotent)
#   netns_cluster.sh down                                    remove everything it created
#   netns_cluster.sh status                                  hosts, addresses, qdiscs
#   netns_cluster.sh hostfile                                print an OpenMPI hostfile
#   netns_cluster.sh exec I COMMAND...                       run COMMAND on host I
#   netns_cluster.sh mpirun [MPIRUN ARGS...]                 one rank per host over TCP
#                                                            (TESSEL_NETNS_SLOTS=S: S ranks per
#                                                            host, consecutive ranks together)
#   netns_cluster.sh wire [SECONDS]                          iperf3: host 0 -> host 1
#
# Host i is namespace ${TESSEL_NETNS_PREFIX}h<i> (default tessel-h<i>), address <subnet>.<i+1> on
# its eth0 (subnet: ${TESSEL_NETNS_SUBNET}, default 10.213.0); the bridge ${TESSEL_NETNS_PREFIX}br
# holds <subnet>.254 so that mpirun, in the root namespace, reaches every host. --rate/--delay
# shape each host's link in both directions (uplink: rate and delay; downlink: rate), so a
# host-to-host path has one-way delay D and rate R, like hosts on a switch; omitting both
# removes the shaping.
set -euo pipefail

prefix=${TESSEL_NETNS_PREFIX:-tessel-}
bridge=${prefix}br
subnet=${TESSEL_NETNS_SUBNET:-10.213.0}
slots=${TESSEL_NETNS_SLOTS:-1}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() { echo "netns_cluster: $*" >&2; exit 1; }
host_ns() { echo "${prefix}h$1"; }
host_addr() { echo "$subnet.$(($1 + 1))"; }
veth_root() { echo "${prefix}v$1"; }
hosts() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${prefix}h[0-9]*$" | sed "s/^${prefix}h//" | sort -n || true; }

need_root() {
  [ "$(id -u)" -eq 0 ] || die "needs root for ip netns (run as root or with sudo)"
  command -v ip > /dev/null && command -v tc > /dev/null ||
    die "needs ip and tc from iproute2 (apt-get install iproute2)"
}

rate_bits() {  # 100mbit -> 100000000
  local n=${1%%[a-z]*}
  [[ "$n" =~ ^[0-9]+$ ]] || die "--rate must be an integer with kbit, mbit or gbit, got '$1'"
  case ${1#"$n"} in
    gbit) echo $((n * 1000000000)) ;;
    mbit) echo $((n * 1000000)) ;;
    kbit) echo $((n * 1000)) ;;
    bit | "") echo "$n" ;;
    *) die "--rate must be an integer with kbit, mbit or gbit, got '$1'" ;;
  esac
}

# Replaces the qdisc of `dev` (tc run under the prefix `$@`, e.g. ip netns exec NS): tbf for the
# rate (bursts of 4 ms, and never less than 2 packets), netem under it for the delay.
shape() {  # dev rate delay mtu cmd-prefix...
  local dev=$1 rate=$2 delay=$3 mtu=$4 parent=root
  shift 4
  "$@" tc qdisc del dev "$dev" root 2> /dev/null || true
  if [ -n "$rate" ]; then
    local burst=$(($(rate_bits "$rate") / 8 / 250))
    [ $burst -ge $((2 * mtu + 1000)) ] || burst=$((2 * mtu + 1000))
    "$@" tc qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency 100ms
    parent="parent 1:1"
  fi
  if [ -n "$delay" ]; then
    # shellcheck disable=SC2086
    "$@" tc qdisc add dev "$dev" $parent handle 10: netem delay "$delay" limit 100000 2> /dev/null ||
      die "--delay needs tc's netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM); use --rate alone"
  fi
}

add_host() {  # i mtu
  local i=$1 mtu=$2 ns v
  ns=$(host_ns "$i")
  v=$(veth_root "$i")
  ip netns list | awk '{print $1}' | grep -qx "$ns" || ip netns add "$ns"
  if ! ip link show "$v" > /dev/null 2>&1; then
    ip link add "$v" type veth peer name eth0 netns "$ns"
  fi
  ip link set "$v" master "$bridge" mtu "$mtu" up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 mtu "$mtu" up
  ip -n "$ns" addr replace "$(host_addr "$i")/24" dev eth0
}

remove_host() {
  ip link del "$(veth_root "$1")" 2> /dev/null || true
  ip netns del "$(host_ns "$1")" 2> /dev/null || true
}

# A TCP connect to a closed port: "refused" proves the address answers (no ping needed).
# Retried for a few seconds while new bridge ports come up.
reachable() {  # i addr
  local try out
  for try in 1 2 3 4 5 6 7 8 9 10; do
    out=$(ip netns exec "$(host_ns "$1")" timeout 1 bash -c "echo > /dev/tcp/$2/9" 2>&1 || true)
    case $out in *refused*) return 0 ;; esac
    sleep 0.5
  done
  return 1
}

cmd_up() {
  [ $# -ge 1 ] || die "usage: up N [--rate R] [--delay D] [--mtu M]"
  local n=$1 rate="" delay="" mtu=1500
  shift
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] ||
    die "N must be a number of hosts from 1 to 200, got '$n'"
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value, e.g. 100mbit}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value, e.g. 1ms}; shift 2 ;;
      --mtu) mtu=${2:?--mtu needs a value, e.g. 9000}; shift 2 ;;
      *) die "unknown option '$1'; use --rate R, --delay D or --mtu M" ;;
    esac
  done
  need_root
  # A failure half way leaves nothing behind.
  trap 'echo "netns_cluster: up failed; removing the cluster" >&2; cmd_down' EXIT
  if ! ip link show "$bridge" > /dev/null 2>&1; then
    ip link add "$bridge" type bridge
  fi
  ip link set "$bridge" mtu "$mtu" up
  ip addr replace "$subnet.254/24" dev "$bridge"
  local i
  for i in $(hosts); do [ "$i" -lt "$n" ] || remove_host "$i"; done
  for ((i = 0; i < n; ++i)); do
    add_host "$i" "$mtu"
    shape eth0 "$rate" "$delay" "$mtu" ip netns exec "$(host_ns "$i")"
    shape "$(veth_root "$i")" "$rate" "" "$mtu" env
  done
  # Ranks reach each other through the bridge; make sure the root namespace does not drop
  # bridged traffic (br_netfilter with a DROP policy would).
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] &&
    echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables
  trap - EXIT
  reachable $((n - 1)) "$(host_addr 0)" ||
    { cmd_down; die "host $((n - 1)) cannot reach host 0 ($(host_addr 0)); cluster removed"; }
  echo "netns_cluster: $n hosts up ($(host_addr 0)..$(host_addr $((n - 1))), mtu $mtu${rate:+, rate $rate}${delay:+, delay $delay})"
}

cmd_down() {
  need_root
  local i
  for i in $(hosts); do remove_host "$i"; done
  for v in $(ip -o link show 2> /dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${prefix}v[0-9]*$" || true); do
    ip link del "$v" 2> /dev/null || true
  done
  ip link del "$bridge" 2> /dev/null || true
}

cmd_status() {
  local i
  [ -n "$(hosts)" ] || { echo "netns_cluster: no hosts"; return 0; }
  for i in $(hosts); do
    printf '%s  %s  %s\n' "$(host_ns "$i")" "$(host_addr "$i")" \
      "$(ip netns exec "$(host_ns "$i")" tc qdisc show dev eth0 | head -1)"
  done
}

cmd_hostfile() {
  local i
  [[ "$slots" =~ ^[1-9][0-9]*$ ]] || die "TESSEL_NETNS_SLOTS must be a positive integer, got '$slots'"
  for i in $(hosts); do echo "$(host_addr "$i") slots=$slots"; done
}

# OpenMPI over the cluster: the rsh agent starts each orted in the namespace that owns the
# host's address; only TCP (no shared memory between "hosts"); no binding, since every orted
# thinks it owns the whole machine and would pin its rank to core 0. OpenMPI's TCP buffer and
# protocol settings stay at their defaults: docs/multihost_namespaces.md measures the others.
cmd_mpirun() {
  [ -n "$(hosts)" ] || die "no hosts; run: $0 up N"
  local hostfile
  hostfile=$(mktemp /tmp/netns_hosts.XXXXXX)
  cmd_hostfile > "$hostfile"
  # One rank per host: round robin over the hosts; several: fill each host's slots in turn.
  local args=(--allow-run-as-root --hostfile "$hostfile" --map-by "$([ "$slots" = 1 ] && echo node || echo slot)" --bind-to none
    --mca plm_rsh_agent "$here/netns_agent.sh" --mca plm_rsh_no_tree_spawn 1
    --mca pml ob1 --mca btl tcp,self
    --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24")
  local rc=0
  mpirun "${args[@]}" "$@" || rc=$?
  rm -f "$hostfile"
  return $rc
}

cmd_exec() {
  [ $# -ge 2 ] || die "usage: exec I COMMAND..."
  local i=$1
  shift
  ip netns list | awk '{print $1}' | grep -qx "$(host_ns "$i")" || die "no host $i; run: $0 up N"
  ip netns exec "$(host_ns "$i")" "$@"
}

cmd_wire() {
  local secs=${1:-5}
  command -v iperf3 > /dev/null || die "wire needs iperf3 (apt-get install iperf3)"
  [ "$(hosts | wc -l)" -ge 2 ] || die "wire needs 2 hosts; run: $0 up 2"
  ip netns exec "$(host_ns 1)" iperf3 -s -1 -D -B "$(host_addr 1)" > /dev/null
  sleep 0.3
  ip netns exec "$(host_ns 0)" iperf3 -c "$(host_addr 1)" -t "$secs" -f g | grep -E "sender|receiver"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  hostfile) cmd_hostfile ;;
  exec) shift; cmd_exec "$@" ;;
  mpirun) shift; cmd_mpirun "$@" ;;
  wire) shift; cmd_wire "$@" ;;
  *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
