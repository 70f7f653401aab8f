#!/usr/bin/env bash
# tests/engines/check_mpirun.sh EXAMPLES_BIN_DIR EXAMPLES_SRC_DIR PSS_LAUNCH WORK_DIR: runs each cluster
# example under a real Open MPI, `mpirun --allow-run-as-root --oversubscribe -np 5` (Debian's openmpi-bin),
# and compares rank 0's output (the chief's) with the example's golden file from the embedded run. pss does
# not link MPI: each process finds its task in the variables mpirun sets (pss::AutoClusterResolver ->
# MpiClusterResolver: rank 0 the chief, ranks 1-2 the ps tasks with PSS_NUM_PS=2, ranks 3-4 the workers,
# rank r on 127.0.0.1:PSS_PORT_BASE+r), over TLS with certificates from `pss-launch --write-certificates`.
# The other ranks serve and print nothing (one that ran alone would print what the chief does).
# Exits 77 (skipped) when mpirun is missing or cannot start 5 processes here. Every run is bounded.
set -euo pipefail
bin=$1 src=$2 launch=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
skip() { echo "check_mpirun.sh: skipped: $*" >&2; exit 77; }
command -v mpirun >/dev/null || skip "mpirun is not installed (Debian: openmpi-bin)"
# Five free consecutive ports, for ranks 0 to 4, below the ephemeral ports, which connections take.
# shellcheck source-path=SCRIPTDIR source=../free_ports.sh
source "$(dirname "${BASH_SOURCE[0]}")/../free_ports.sh"
port_base=$(free_ports 5 32000)
"$launch" --ps 2 --workers 2 --write-certificates "$work/tls" >/dev/null
chmod 700 "$work/tls"
mpi=(timeout 300 mpirun --allow-run-as-root --oversubscribe -np 5 --tag-output
     -x PSS_NUM_PS=2 -x "PSS_PORT_BASE=$port_base" -x "PSS_TLS_DIR=$work/tls")
if ! "${mpi[@]}" true >"$work/probe.out" 2>&1; then skip "mpirun cannot start 5 processes here: $(head -c 400 "$work/probe.out")"; fi
status=0
for name in seed_num_replicas seed_variable shard_placement seed_fit embedding_ctr; do
  # Open MPI gives every rank a pseudo-terminal for stdout, so fit would draw its progress bar as on a
  # terminal; a pipe gives the output a file or a log collector gets, which is what the golden files hold.
  set +e
  "${mpi[@]}" bash -o pipefail -c '"$0" | cat' "$bin/$name" >"$work/$name.out" 2>"$work/$name.err"
  rc=$?
  set -e
  sed -n 's/^\[1,0\]<stdout>://p' "$work/$name.out" >"$work/$name.chief"
  if [[ $rc -ne 0 ]]; then
    echo "check_mpirun.sh: $name under mpirun -np 5 exited with $rc:"; tail -n 20 "$work/$name.err"; status=1
  elif grep -q -v '^\[1,0\]' "$work/$name.out"; then
    # A rank that did not find its task would run the whole embedded cluster and print what the chief does.
    echo "check_mpirun.sh: $name under mpirun -np 5: ranks other than the chief wrote to stdout:"
    grep -v '^\[1,0\]' "$work/$name.out" | head -n 5
    status=1
  elif ! cmp -s "$src/$name.expected" "$work/$name.chief"; then
    echo "check_mpirun.sh: $name under mpirun -np 5: rank 0's output differs from $name.expected:"
    diff "$src/$name.expected" "$work/$name.chief" || true
    status=1
  else
    echo "check_mpirun.sh: $name under mpirun -np 5: ok"
  fi
done
exit $status
