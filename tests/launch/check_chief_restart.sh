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
# shellcheck source-path=SCRIPTDIR source=hand_cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/hand_cluster.sh"
status=0
run_chief_twice "$launch" "$work" "$program" --chief-restart "$work"
cat "$work/chief_first.out" "$work/chief_second.out" >"$work/chief.out"
if ! cmp -s "$expected" "$work/chief.out"; then
  echo "the chiefs' output differs from $expected:"; diff "$expected" "$work/chief.out" || true; status=1
fi
if ! grep -q "^pss: /job:ps/replica:0/task:0: a new chief connected (a new run); dropped the last run's 1 shard$" "$work/ps0.err"; then
  echo "ps 0 did not say it dropped the last run's shard:"; cat "$work/ps0.err"; status=1
fi
exit $status
