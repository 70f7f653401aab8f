#!/usr/bin/env bash
# tests/engines/check_hosts.sh EXAMPLES_BIN_DIR EXAMPLES_SRC_DIR PSS_LAUNCH WORK_DIR: five hosts on one
# machine. Each task of 1 chief, 2 ps and 2 workers runs in a network namespace of its own, with its own
# address (10.77.0.1-5) on a bridge, and is named by host name in TF_CONFIG (chief.pss.test:4000, ...),
# found through the system resolver (each host's /etc/hosts); nothing rides on 127.0.0.1. For each
# cluster example, the chief's stdout must equal the embedded run's golden file and every task must exit
# 0; while embedding_ctr trains, every ps and worker must listen on its own address only (not 0.0.0.0;
# the chief serves nothing). Links are
# TLS, with certificates from `pss-launch --write-certificates`. Exits 77 (skipped) where network
# namespaces cannot be made. Every process started here is waited for, or killed by its pid.
set -euo pipefail
bin=$1 src=$2 launch=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../launch/netns.sh
source "$(dirname "$(dirname "${BASH_SOURCE[0]}")")/launch/netns.sh"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  remove_hosts
}
trap cleanup EXIT
make_hosts "$work" chief ps-0 ps-1 worker-0 worker-1
cluster='{"chief": ["chief.pss.test:4000"], "ps": ["ps-0.pss.test:4000", "ps-1.pss.test:4000"],
          "worker": ["worker-0.pss.test:4000", "worker-1.pss.test:4000"]}'
"$launch" --ps 2 --workers 2 --write-certificates "$work/tls" >/dev/null
export PSS_TLS_DIR=$work/tls
unset PSS_TLS_CA PSS_TLS_CERT PSS_TLS_KEY TF_CONFIG
status=0

# listens_on_own_address HOST: the task on HOST listens on its address and port 4000 only.
listens_on_own_address() {
  local host=$1 listening=""
  for _ in $(seq 100); do
    listening=$(ip netns exec "${host_ns[$host]}" ss -Hltn 'sport = :4000' | awk '{print $4}')
    [[ -n $listening ]] && break
    sleep 0.1
  done
  if [[ $listening != "${host_ip[$host]}:4000" ]]; then
    echo "check_hosts.sh: the task on $host listens on '${listening:-nothing}', not ${host_ip[$host]}:4000 only"
    return 1
  fi
}

for name in seed_num_replicas seed_variable shard_placement seed_fit embedding_ctr; do
  pids=()
  for host in ps-0 ps-1 worker-0 worker-1; do
    type=${host%-*} index=${host#*-}
    TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"$type\", \"index\": $index}}" \
      ip netns exec "${host_ns[$host]}" timeout 240 "$bin/$name" >"$work/$name.$host.out" 2>"$work/$name.$host.err" &
    pids+=($!)
  done
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"chief\", \"index\": 0}}" \
    ip netns exec "${host_ns[chief]}" timeout 240 "$bin/$name" >"$work/$name.chief.out" 2>"$work/$name.chief.err" &
  chief=$!
  pids+=("$chief")
  if [[ $name == embedding_ctr ]]; then
    for host in ps-0 ps-1 worker-0 worker-1; do listens_on_own_address "$host" || status=1; done
  fi
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  pids=()
  if ((failed)); then
    echo "check_hosts.sh: $name on 5 hosts: a task exited with an error:"; tail -n 5 "$work/$name".*.err; status=1
  elif ! cmp -s "$src/$name.expected" "$work/$name.chief.out"; then
    echo "check_hosts.sh: $name on 5 hosts: the chief's output differs from $name.expected:"
    diff "$src/$name.expected" "$work/$name.chief.out" || true
    status=1
  else
    echo "check_hosts.sh: $name on 5 hosts: ok"
  fi
done
exit $status
