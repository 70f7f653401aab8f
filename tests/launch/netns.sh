# tests/launch/netns.sh: sourced by the scripts that run a cluster on several "hosts" of one machine.
# shellcheck shell=bash
# shellcheck disable=SC2034  # host_ns, host_ip and host_port are read by the scripts that source this file
# make_hosts WORK NAME...: one network namespace per NAME, each with its own address 10.77.0.1, .2, ... on a
# veth pair to one bridge, the bridge in a namespace of its own too (nothing of the machine's network is
# touched). Each host also gets a hosts file (/etc/netns/NS/hosts, which `ip netns exec` shows as
# /etc/hosts) naming every host NAME.pss.test, so that tasks may be named by host name and found through
# the system resolver. Sets `bridge` (the bridge's namespace), `host_ns[NAME]` (a host's namespace),
# `host_ip[NAME]` and `host_port[NAME]` (its bridge port, e.g. to cut its link). Exits 77 (skipped) where
# namespaces cannot be made, entered or given a bridge. remove_hosts removes every namespace and hosts
# file made here; call it on exit (a trap).
netns_prefix=pss$$
netns_made=()
declare -A host_ns host_ip host_port

make_hosts() {
  local work=$1 i=0 name ns
  shift
  bridge=${netns_prefix}br
  if ! ip netns add "$bridge" 2>"$work/netns.err"; then
    echo "skipped: network namespaces cannot be made here (ip netns add: $(cat "$work/netns.err"))"
    exit 77
  fi
  netns_made+=("$bridge")
  if ! ip netns exec "$bridge" true 2>"$work/netns.err" || ! ip -n "$bridge" link add br0 type bridge 2>>"$work/netns.err"; then
    remove_hosts
    echo "skipped: a network namespace cannot be entered or given a bridge here ($(cat "$work/netns.err"))"
    exit 77
  fi
  ip -n "$bridge" link set br0 up
  local hosts="127.0.0.1 localhost"$'\n'
  for name in "$@"; do
    hosts+="10.77.0.$((i + 1)) $name.pss.test"$'\n'
    i=$((i + 1))
  done
  i=0
  for name in "$@"; do
    ns=$netns_prefix$name
    ip netns add "$ns"
    netns_made+=("$ns")
    mkdir -p "/etc/netns/$ns"
    printf '%s' "$hosts" >"/etc/netns/$ns/hosts"
    ip -n "$bridge" link add "port$i" type veth peer name eth0 netns "$ns"
    ip -n "$bridge" link set "port$i" master br0 up
    ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    host_ns[$name]=$ns
    host_ip[$name]=10.77.0.$((i + 1))
    host_port[$name]=port$i
    i=$((i + 1))
  done
}

remove_hosts() {
  local ns
  for ns in "${netns_made[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true  # only when no one else's is left
  netns_made=()
}
