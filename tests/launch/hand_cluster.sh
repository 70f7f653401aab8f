# tests/launch/hand_cluster.sh: sourced by the scripts that start a cluster by hand. Sets `cluster`, the
# "cluster" part of a TF_CONFIG for 1 chief, 2 ps and 2 workers on 127.0.0.1 ports free now.
# shellcheck shell=bash disable=SC2034  # cluster, ports and status are the sourcing script's
# shellcheck source-path=SCRIPTDIR source=../free_ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/../free_ports.sh"
mapfile -t ports < <(free_ports 5)
cluster="{\"chief\": [\"127.0.0.1:${ports[0]}\"], \"ps\": [\"127.0.0.1:${ports[1]}\", \"127.0.0.1:${ports[2]}\"], \"worker\": [\"127.0.0.1:${ports[3]}\", \"127.0.0.1:${ports[4]}\"]}"

# run_chief_twice LAUNCH WORK PROGRAM ARGS...: with certificates from `LAUNCH --write-certificates`, starts
# ps 0, ps 1, worker 0 and worker 1 running `PROGRAM ARGS...` with their TF_CONFIG, then a chief that must
# kill itself (exit 137) while the others serve on, then a second chief with the same TF_CONFIG, and waits
# for every task, which must exit 0. Output in WORK/<type><index>.out and .err, WORK/chief_first.* and
# WORK/chief_second.*; sets status=1 on each failure. A task still running at exit is killed by its pid.
run_chief_twice() {
  local launch=$1 work=$2
  shift 2
  "$launch" --ps 2 --workers 2 --write-certificates "$work/tls" >/dev/null
  export PSS_TLS_DIR=$work/tls
  unset PSS_TLS_CA PSS_TLS_CERT PSS_TLS_KEY
  tf_config() { echo "{\"cluster\": $cluster, \"task\": {\"type\": \"$1\", \"index\": $2}}"; }
  pids=()
  cleanup() { for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done; }
  trap cleanup EXIT
  local task type index first i
  for task in ps:0 ps:1 worker:0 worker:1; do
    type=${task%%:*} index=${task##*:}
    TF_CONFIG=$(tf_config "$type" "$index") timeout 120 "$@" >"$work/$type$index.out" 2>"$work/$type$index.err" &
    pids+=($!)
  done
  set +e
  TF_CONFIG=$(tf_config chief 0) timeout 120 "$@" >"$work/chief_first.out" 2>"$work/chief_first.err"
  first=$?
  set -e
  if [[ $first -ne 137 ]]; then echo "the first chief exited with $first, not 137 (SIGKILL):"; cat "$work/chief_first.err"; status=1; fi
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then echo "task $i ended with the first chief"; status=1; fi
  done
  if ! TF_CONFIG=$(tf_config chief 0) timeout 120 "$@" >"$work/chief_second.out" 2>"$work/chief_second.err"; then
    echo "the second chief failed:"; cat "$work/chief_second.err"; status=1
  fi
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then echo "task $i exited with an error:"; cat "$work"/*.err; status=1; fi
  done
  pids=()
}
