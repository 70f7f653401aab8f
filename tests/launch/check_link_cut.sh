#!/usr/bin/env bash
# tests/launch/check_link_cut.sh PROGRAM PSS_LAUNCH EXPECTED WORK_DIR: runs `PROGRAM --ps-loss cut` as a
# cluster of 1 chief, 2 ps and 2 workers on five hosts: each task in a network namespace of its own, with
# its own address (10.77.0.1-5) on a veth pair to one bridge (in a namespace of its own too, so nothing of
# the machine's network is touched). Once the chief has trained on ps 1, the link of ps 1 is cut (its
# bridge port set down: its packets are dropped, nothing answers a connect); the chief's error must name
# ps 1 within the limit the program checks, ps 0 and the workers end when the chief ends the cluster, and
# ps 1, which never hears from a chief again, ends by itself after PSS_CHIEF_TIMEOUT with an error naming
# why. Compares the chief's stdout with EXPECTED. Exits 77 (skipped) where network namespaces cannot be
# made. Every process started here is waited for or ended by its pid; the namespaces are removed on exit.
set -euo pipefail
program=$1 launch=$2 expected=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"
tasks=(chief:0 ps:0 ps:1 worker:0 worker:1)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  remove_hosts
}
trap cleanup EXIT
make_hosts "$work" chief0 ps0 ps1 worker0 worker1
port=4000
cluster="{\"chief\": [\"10.77.0.1:$port\"], \"ps\": [\"10.77.0.2:$port\", \"10.77.0.3:$port\"], \"worker\": [\"10.77.0.4:$port\", \"10.77.0.5:$port\"]}"
"$launch" --ps 2 --workers 2 --write-certificates "$work/tls" >/dev/null
export PSS_TLS_DIR=$work/tls
unset PSS_TLS_CA PSS_TLS_CERT PSS_TLS_KEY
export PSS_HEARTBEAT_TIMEOUT=2 PSS_HEARTBEAT_INTERVAL=0.2 PSS_CHIEF_TIMEOUT=4
declare -A pid_of
for task in "${tasks[@]:1}"; do
  type=${task%%:*} index=${task##*:}
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"$type\", \"index\": $index}}" \
    ip netns exec "${host_ns[$type$index]}" timeout 120 "$program" --ps-loss cut "$work" \
    >"$work/$type$index.out" 2>"$work/$type$index.err" &
  pids+=($!)
  pid_of[$task]=$!
done
# The link cut: when the chief says go, the bridge port of ps 1 goes down.
(
  for _ in $(seq 1200); do [[ -e $work/go ]] && break; sleep 0.1; done
  ip -n "$bridge" link set "${host_port[ps1]}" down
  date +%s%N >"$work/died"
) &
cutter=$!
status=0
if ! TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"chief\", \"index\": 0}}" \
  ip netns exec "${host_ns[chief0]}" timeout 120 "$program" --ps-loss cut "$work" >"$work/chief.out" 2>"$work/chief.err"; then
  echo "the chief failed:"; cat "$work/chief.err"; status=1
fi
wait "$cutter" || true
grep "^cluster_program:" "$work/chief.err" || true
for task in ps:0 worker:0 worker:1; do
  if ! wait "${pid_of[$task]}"; then echo "$task exited with an error:"; cat "$work/${task/:/}.err"; status=1; fi
done
# ps 1 is cut off: it must end by itself, with an error, once no chief was heard from for PSS_CHIEF_TIMEOUT.
set +e
wait "${pid_of[ps:1]}"
ps1=$?
set -e
pids=()
if [[ $ps1 -eq 0 || $ps1 -eq 124 ]]; then
  echo "ps 1 exited with $ps1; it should have ended with an error after PSS_CHIEF_TIMEOUT:"; cat "$work/ps1.err"; status=1
fi
if ! grep -q "no chief was heard from for 4 s (PSS_CHIEF_TIMEOUT)" "$work/ps1.err"; then
  echo "ps 1 did not say why it ended:"; cat "$work/ps1.err"; status=1
fi
if ! cmp -s "$expected" "$work/chief.out"; then
  echo "the chief's output differs from $expected:"; diff "$expected" "$work/chief.out" || true; status=1
fi
exit $status
