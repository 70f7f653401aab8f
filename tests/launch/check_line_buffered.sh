#!/usr/bin/env bash
# tests/launch/check_line_buffered.sh LAUNCH ECHO_TASK WORK_DIR: a chief that prints a line without
# flushing and then waits (at most 30 s) until someone saw it. Under pss-launch its stdout is a pipe, which
# C's stdio buffers fully unless pss made it line-buffered (PSS_LINE_BUFFERED=1): the test reads the
# launcher's output as it comes and answers the line, so the chief ends at once with status 0 only when
# the line arrived while it ran.
set -euo pipefail
launch=$1 task=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
seen_line=0 status=none
while IFS= read -r line; do
    echo "$line"
    [[ $line == "pss-launch exit "* ]] && status=${line#pss-launch exit }
    if [[ $line == "[chief] chief waits to be seen" ]]; then
        touch "$work/chief_0.seen"
        seen_line=1
    fi
done < <(status=0; "$launch" --ps 1 --workers 1 -- "$task" --pid-dir "$work" chief=wait-seen '*=sleep' || status=$?
         echo "pss-launch exit $status")
[[ $seen_line == 1 ]] || { echo "check_line_buffered: the chief's line never arrived" >&2; exit 1; }
[[ $status == 0 ]] || { echo "check_line_buffered: pss-launch exited with $status, not 0 (the chief waited in vain)" >&2; exit 1; }
