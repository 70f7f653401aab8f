#!/usr/bin/env bash
# tests/launch/check_chief_restart.sh PROGRAM PSS_LAUNCH EXPECTED WORK_DIR: runs `PROGRAM --chief-restart` as
# a cluster of 1 chief, 2 ps and 2 workers started by hand with their TF_CONFIG (certificates from
# `pss-launch --write-certificates`). The first chief kills itself (SIGKILL); the ps and worker tasks must
# serve on; a second chief with the same TF_CONFIG takes them over and ends the cluster, and every ps and
# worker then exits 0. Compares the two chiefs' stdout with EXPECTED. Every process started here is
# waited for, or killed by its pid after 120 s.
set -euo pipefail
program=$1 launch=$2 expected=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "${BASH_SOURCE[0]}")/hand_cluster.sh"
"$launch" --ps 2 --workers 2 --write-certificates "$work/tls" >/dev/null
export PSS_TLS_DIR=$work/tls
unset PSS_TLS_CA PSS_TLS_CERT PSS_TLS_KEY
tf_config() { echo "{\"cluster\": $cluster, \"task\": {\"type\": \"$1\", \"index\": $2}}"; }
pids=()
cleanup() { for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
for task in ps:0 ps:1 worker:0 worker:1; do
  type=${task%%:*} index=${task##*:}
  TF_CONFIG=$(tf_config "$type" "$index") timeout 120 "$program" --chief-restart "$work" \
    >"$work/$type$index.out" 2>"$work/$type$index.err" &
  pids+=($!)
done
status=0
set +e
TF_CONFIG=$(tf_config chief 0) timeout 120 "$program" --chief-restart "$work" >"$work/chief_first.out" 2>"$work/chief_first.err"
first=$?
set -e
if [[ $first -ne 137 ]]; then echo "the first chief exited with $first, not 137 (SIGKILL):"; cat "$work/chief_first.err"; status=1; fi
for i in "${!pids[@]}"; do
  if ! kill -0 "${pids[$i]}" 2>/dev/null; then echo "task $i ended with the first chief"; status=1; fi
done
if ! TF_CONFIG=$(tf_config chief 0) timeout 120 "$program" --chief-restart "$work" >"$work/chief_second.out" 2>"$work/chief_second.err"; then
  echo "the second chief failed:"; cat "$work/chief_second.err"; status=1
fi
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then echo "task $i exited with an error:"; cat "$work"/*.err; status=1; fi
done
pids=()
cat "$work/chief_first.out" "$work/chief_second.out" >"$work/chief.out"
if ! cmp -s "$expected" "$work/chief.out"; then
  echo "the chiefs' output differs from $expected:"; diff "$expected" "$work/chief.out" || true; status=1
fi
if ! grep -q "^pss: /job:ps/replica:0/task:0: a new chief connected (a new run); dropped the last run's 1 shard$" "$work/ps0.err"; then
  echo "ps 0 did not say it dropped the last run's shard:"; cat "$work/ps0.err"; status=1
fi
exit $status
