#!/usr/bin/env bash
# tests/check_demo.sh DEMO_PROGRAM WORK_DIR: the main job as tools/demo.sh runs it (the digits split and the
# reference by tools/digits.py, then the demo on the same split), passing when both held-out accuracies
# are above 90%. Which of the two is higher is the demo's goal, printed, not asserted: asynchronous
# training is not the same twice.
set -euo pipefail
program=$1 work=$2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! /usr/bin/python3 -c 'import sklearn' 2>/dev/null; then
    echo "check_demo: Debian's python3-sklearn is missing (tools/test.sh installs it: apt-get install python3-sklearn)" >&2
    exit 1
fi
rm -rf "$work"
out=$( { /usr/bin/python3 "$root/tools/digits.py" "$work" && "$program" "$work"; } | tee /dev/stderr | grep 'held-out accuracy')
accuracies=$(sed -E 's/.*held-out accuracy ([0-9.]+)%.*/\1/' <<<"$out")
if [[ $(wc -l <<<"$accuracies") -ne 2 ]]; then
    echo "check_demo: expected two held-out accuracies (the reference's, the demo's), got: $out" >&2
    exit 1
fi
read -r reference demo <<<"$(tr '\n' ' ' <<<"$accuracies")"
echo "held-out accuracy: reference $reference%, pss $demo%"
awk -v r="$reference" -v d="$demo" 'BEGIN { exit !(r > 90 && d > 90) }' ||
    { echo "check_demo: an accuracy is not above 90%" >&2; exit 1; }
