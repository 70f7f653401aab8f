#!/usr/bin/env bash
# tests/engines/check_slurm.sh EXAMPLES_BIN_DIR EXAMPLES_SRC_DIR PSS_LAUNCH WORK_DIR: runs each cluster
# example under a real single-node Slurm (Debian's slurm-wlm and munge) and compares rank 0's output (the
# chief's) with the example's golden file from the embedded run. The script starts its own munged,
# slurmctld and slurmd, all of them configured, logging and keeping state in WORK_DIR (their Unix sockets in
# a short directory under /tmp, removed at exit; nothing under
# /etc, /run or /var is used), runs `srun -n 5 --label` for each example, then submits
# EXAMPLES_SRC_DIR/slurm/train.sbatch with `sbatch --wait` and checks its output the same way.
# pss does not link Slurm: each task finds its place in the variables srun sets (pss::AutoClusterResolver
# -> SlurmClusterResolver: rank 0 the chief, ranks 1-2 the ps tasks with PSS_NUM_PS=2, ranks 3-4 the
# workers, rank r on this node's PSS_PORT_BASE+r), over TLS with certificates from
# `pss-launch --write-certificates` (PSS_TLS_DIR).
# Run as root, e.g.
#   bash tests/engines/check_slurm.sh build/examples examples build/tools/pss_launch/pss-launch /tmp/slurm_work
# Exits 0 when every check passes, 1 when one fails, 77 (skipped) when not root, when Slurm or munge is
# not installed, or when the daemons cannot be started or the node does not become idle in 30 s.
# Every wait is bounded; a trap stops every daemon started here (by the pids in their pid files) and
# removes nothing outside WORK_DIR.
# shellcheck disable=SC2317  # the cleanup functions are called by the EXIT trap, which shellcheck does not follow
set -euo pipefail
if [[ $# -ne 4 ]]; then
  echo "usage: check_slurm.sh EXAMPLES_BIN_DIR EXAMPLES_SRC_DIR PSS_LAUNCH WORK_DIR" >&2
  exit 2
fi
bin=$1 src=$2 launch=$3 work=$4
examples=(seed_num_replicas seed_variable shard_placement seed_fit embedding_ctr)
skip() { echo "check_slurm.sh: skipped: $*" >&2; exit 77; }
fail() { echo "check_slurm.sh: $*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || skip "not root (slurmd and munged of this test run as root)"
for tool in munged mungekey slurmctld slurmd srun sbatch scontrol sinfo squeue scancel timeout python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (Debian: slurm-wlm, munge, coreutils, python3)"
done
# The project's own binaries missing is a broken build, not a machine without Slurm: fail, do not skip.
for name in "${examples[@]}"; do [[ -x $bin/$name ]] || fail "$bin/$name is missing (build the examples)"; done
[[ -x $launch ]] || fail "$launch is missing (build pss-launch)"
[[ -f $src/slurm/train.sbatch ]] || fail "$src/slurm/train.sbatch is missing"
node=$(hostname -s)
# The tasks find each other by the node name srun gives them.
getent hosts "$node" >/dev/null || skip "this machine's name $node does not resolve"

[[ -n $work && $work != / ]] || fail "WORK_DIR must name a scratch directory"
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd)
# Whatever the caller's shell holds about another cluster must not reach srun, sbatch or the tasks:
# TF_CONFIG would win over Slurm in AutoClusterResolver, SLURM_JOB_ID would send srun into a foreign job.
unset TF_CONFIG PSS_NUM_PS PSS_PORT_BASE PSS_TLS_DIR PSS_TLS_CA PSS_TLS_CERT PSS_TLS_KEY
while read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|SALLOC)_' || true)

conf=$work/slurm.conf
mkdir -m 700 "$work/munge"
mkdir "$work/state"
# munged's and slurmd's Unix sockets may not have paths longer than 107 bytes, and WORK_DIR (a build
# tree) can be deep: they live in a short directory of their own, removed at exit.
sockets=$(mktemp -d /tmp/pss-slurm.XXXXXX)
mkdir "$sockets/spool"

# stop_daemon NAME PID_FILE: SIGTERM to the pid in PID_FILE if that process is still NAME (a pid reused by
# another program is left alone), SIGKILL after 10 s.
stop_daemon() {
  local name=$1 pid_file=$2 pid i
  [[ -s $pid_file ]] || return 0
  pid=$(<"$pid_file")
  [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do [[ -e /proc/$pid ]] || return 0; sleep 0.1; done
  echo "check_slurm.sh: $name (pid $pid) ignored SIGTERM for 10 s: SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
}
# run_bounded COMMAND...: runs COMMAND in the background and waits for it, because bash runs the INT and
# TERM traps only once a foreground command has ended; COMMAND is the srun or sbatch of a check, under
# timeout, and its pid is kept for the cleanup.
child=
run_bounded() {
  local rc=0
  "$@" &
  child=$!
  wait "$child" || rc=$?
  child=
  return $rc
}
cleanup() {
  set +e
  local i p
  if [[ -n $child ]]; then
    # Interrupted during a check: timeout passes SIGTERM on to srun or sbatch, which cancel their job.
    kill -TERM "$child" 2>/dev/null
    for ((i = 0; i < 150; i++)); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$child" 2>/dev/null
  fi
  if [[ -s $work/slurmctld.pid ]]; then
    # Cancel what is left (a run cut short by a signal), so that slurmd's step daemons end their tasks.
    SLURM_CONF=$conf timeout 10 scancel --user=root >/dev/null 2>&1
    for ((i = 0; i < 50; i++)); do
      [[ -z $(SLURM_CONF=$conf timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
  stop_daemon slurmd "$work/slurmd.pid"
  stop_daemon slurmctld "$work/slurmctld.pid"
  stop_daemon munged "$work/munge/munged.pid"
  rm -rf "$sockets"
  # Last resort: anything still carrying this run's SLURM_CONF (a step daemon, a task, slurmctld's
  # slurmscriptd) was started by this script through Slurm; nothing else has that path.
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p == "$$" || $p == "$BASHPID" ]] && continue
    if grep -qzxF "SLURM_CONF=$conf" "/proc/$p/environ" 2>/dev/null; then
      echo "check_slurm.sh: process $p ($(cat "/proc/$p/comm" 2>/dev/null)) outlived the daemons: SIGKILL" >&2
      kill -KILL "$p" 2>/dev/null
    fi
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# shellcheck source-path=SCRIPTDIR source=../free_ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/../free_ports.sh"
ephemeral_low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
{ read -r ctld_port; read -r slurmd_port; } < <(free_ports 2)

# munge: its own key, socket, pid, log and seed in WORK_DIR. --force: as root munged otherwise refuses
# some of the ownership checks it makes for a system install.
mungekey --create --keyfile="$work/munge/munge.key" >/dev/null 2>&1 || skip "mungekey cannot create a key"
munged --force --socket="$sockets/munge" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" --seed-file="$work/munge/seed" \
  >"$work/munge/munged.out" 2>&1 || skip "munged did not start: $(tail -q -n 3 "$work/munge/munged.out" "$work/munge/munged.log" 2>/dev/null | tr '\n' ' ')"
for ((i = 0; i < 100; i++)); do [[ -S $sockets/munge && -s $work/munge/munged.pid ]] && break; sleep 0.1; done
[[ -S $sockets/munge ]] || skip "munged made no socket in 10 s: $(tail -q -n 3 "$work/munge/munged.log" 2>/dev/null | tr '\n' ' ')"

# A node of 8 CPUs on a 2-core machine: config_overrides makes slurmd take the declared CPUs (else the node
# is invalid), and OverSubscribe lets five tasks of one step and a batch job share them.
cat >"$conf" <<EOF
# Written by tests/engines/check_slurm.sh for one test run: its files are in $work, its sockets in $sockets.
ClusterName=psstest
SlurmctldHost=$node
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sockets/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
KillWait=5
StateSaveLocation=$work/state
SlurmdSpoolDir=$sockets/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmdParameters=config_overrides
NodeName=$node CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=pss Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
export SLURM_CONF=$conf
timeout 30 slurmctld -f "$conf" >"$work/slurmctld.out" 2>&1 ||
  skip "slurmctld did not start: $(tail -q -n 3 "$work/slurmctld.out" "$work/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
timeout 30 slurmd -f "$conf" >"$work/slurmd.out" 2>&1 ||
  skip "slurmd did not start: $(tail -q -n 3 "$work/slurmd.out" "$work/slurmd.log" 2>/dev/null | tr '\n' ' ')"

# Wait (30 s at most) for the node to be idle; a node left down or drained by an earlier state is resumed.
state=
for ((i = 0; i < 60; i++)); do
  state=$(timeout 5 sinfo -h -n "$node" -o %t 2>/dev/null || true)
  [[ $state == idle ]] && break
  if [[ $state == down* || $state == drain* ]]; then
    timeout 5 scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
  fi
  sleep 0.5
done
[[ $state == idle ]] || skip "node $node is not idle after 30 s (state '${state}'); see $work/slurmctld.log and $work/slurmd.log"

"$launch" --ps 2 --workers 2 --write-certificates "$work/tls" >/dev/null
chmod 700 "$work/tls"

status=0 failed=()
# timed_out RC: " (timed out)" when RC is what timeout returns for a command it had to stop.
timed_out() { if [[ $1 -eq 124 || $1 -eq 137 ]]; then echo " (timed out)"; fi; }
# check_output NAME WHAT OUT: rank 0's lines of OUT (srun --label: "0: ", padded on the left when the step
# has 10 tasks or more) must equal NAME.expected, and no other rank may write to stdout (a task that did
# not find its place would run the whole embedded cluster and print what the chief does).
check_output() {
  local name=$1 what=$2 out=$3
  sed -n 's/^ *0: //p' "$out" >"${out%.out}.chief"
  if grep -q -v -E '^ *0: ' "$out"; then
    echo "check_slurm.sh: $name $what: ranks other than the chief wrote to stdout:"
    grep -v -E '^ *0: ' "$out" | head -n 5
    return 1
  elif ! cmp -s "$src/$name.expected" "${out%.out}.chief"; then
    echo "check_slurm.sh: $name $what: rank 0's output differs from $name.expected:"
    diff "$src/$name.expected" "${out%.out}.chief" || true
    return 1
  fi
}

for name in "${examples[@]}"; do
  port_base=$(free_ports 5 "$ephemeral_low")
  start=$(date +%s.%N)
  rc=0
  run_bounded timeout -k 10 240 srun -n 5 --label --kill-on-bad-exit=0 \
    --export="ALL,PSS_TLS_DIR=$work/tls,PSS_NUM_PS=2,PSS_PORT_BASE=$port_base" \
    "$bin/$name" >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [[ $rc -ne 0 ]]; then
    echo "check_slurm.sh: $name under srun -n 5 exited with $rc after $seconds s$(timed_out "$rc"); its stderr:"
    tail -n 20 "$work/$name.err"
    status=1 failed+=("$name")
  elif ! check_output "$name" "under srun -n 5" "$work/$name.out"; then
    status=1 failed+=("$name")
  else
    echo "check_slurm.sh: $name under srun -n 5: ok ($seconds s)"
  fi
done

# A batch job as a user would submit it: the job script runs srun itself; its working directory is
# WORK_DIR, so the program's path is given as an argument.
port_base=$(free_ports 5 "$ephemeral_low")
start=$(date +%s.%N)
rc=0
run_bounded timeout -k 10 300 sbatch --wait --quiet --chdir="$work" --output="$work/train.out" --error="$work/train.err" \
  --export="ALL,PSS_TLS_DIR=$work/tls,PSS_PORT_BASE=$port_base" \
  "$src/slurm/train.sbatch" "$bin/seed_fit" >"$work/sbatch.out" 2>&1 || rc=$?
seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [[ $rc -ne 0 ]]; then
  echo "check_slurm.sh: sbatch --wait slurm/train.sbatch exited with $rc after $seconds s$(timed_out "$rc"):"
  tail -n 20 "$work/sbatch.out" "$work/train.err" 2>/dev/null
  status=1 failed+=("train.sbatch")
elif ! check_output seed_fit "under sbatch slurm/train.sbatch" "$work/train.out"; then
  status=1 failed+=("train.sbatch")
else
  echo "check_slurm.sh: seed_fit under sbatch slurm/train.sbatch: ok ($seconds s)"
fi

total=$(( ${#examples[@]} + 1 ))
if [[ $status -eq 0 ]]; then
  echo "check_slurm.sh: all $total checks passed (${#examples[@]} examples under srun, 1 batch job) in $SECONDS s"
else
  echo "check_slurm.sh: $(( total - ${#failed[@]} )) of $total checks passed; failed: ${failed[*]}; logs in $work"
fi
exit $status
