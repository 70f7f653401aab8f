#!/usr/bin/env bash
# tests/launch/check_fit_restart.sh PROGRAM PSS_LAUNCH WORK_DIR: a chief killed inside a synchronous
# Sequential::fit with BackupAndRestore, and started again, resumes after the last backup and ends with the
# bits of a fit that never stopped. `PROGRAM fit DIR whole` runs the whole fit embedded (the reference);
# then 1 chief, 2 ps and 2 workers are started by hand with their TF_CONFIG (certificates from `pss-launch
# --write-certificates`) running `PROGRAM fit DIR once`: the first chief kills itself (SIGKILL) once the
# backup of epoch 2 is committed; the ps and worker tasks serve on; a second chief with the same TF_CONFIG
# restores the backup, prints the epochs after it and the weights, which must equal the reference's lines
# from there on, and ends the cluster; every ps and worker then exits 0. Every process started here is waited
# for, or killed by its pid after 120 s.
set -euo pipefail
program=$1 launch=$2 work=$3
rm -rf "$work" && mkdir -p "$work/whole" "$work/once"
# shellcheck source-path=SCRIPTDIR source=hand_cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/hand_cluster.sh"
status=0
if ! timeout 120 "$program" fit "$work/whole" whole >"$work/whole.out" 2>"$work/whole.err"; then
  echo "the embedded reference fit failed:"; cat "$work/whole.err"; exit 1
fi
run_chief_twice "$launch" "$work" "$program" fit "$work/once" once
# The first chief dies as soon as it sees the backup of epoch 2 committed; on a loaded machine it may see
# it only once epoch 3's is (both are a resume mid-fit): the second chief resumes after the backup it finds.
restored=$(sed -n '1s/^Restored the backup of epoch \([23]\) from .*$/\1/p' "$work/chief_second.out")
if [[ -z $restored ]]; then
  echo "the second chief did not restore the backup of epoch 2 or 3:"; cat "$work/chief_second.out"; restored=2; status=1
fi
{ echo "Restored the backup of epoch $restored from $work/once/backup"; sed -n "/^Epoch $((restored + 1))\/4\$/,\$p" "$work/whole.out"; } >"$work/expected.out"
if ! grep -q '^weights: [0-9a-f]\{8\}' "$work/expected.out"; then
  echo "the reference printed no epoch $((restored + 1)) or no weights:"; cat "$work/whole.out"; status=1
fi
if ! cmp -s "$work/expected.out" "$work/chief_second.out"; then
  echo "the second chief's output differs from the reference's from epoch $((restored + 1)) on:"
  diff "$work/expected.out" "$work/chief_second.out" || true; status=1
fi
if ! grep -q "^pss: /job:ps/replica:0/task:0: a new chief connected (a new run); dropped the last run's [0-9]* shards\?$" "$work/ps0.err"; then
  echo "ps 0 did not say it dropped the last run's shards:"; cat "$work/ps0.err"; status=1
fi
exit $status
