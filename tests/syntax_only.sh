#!/bin/sh
# tests/syntax_only.sh: the compiler launcher of pss_header_checks. A header check proves that a header
# parses and instantiates on its own; the code it would generate is never linked, so the compiler stops
# before code generation (-fsyntax-only: about half the time of a full compile for pss/keras.hpp), and
# the object file the build expects is an empty stamp.
set -e
"$@" -fsyntax-only
out=
while [ $# -gt 0 ]; do
    if [ "$1" = "-o" ]; then out=$2; break; fi
    shift
done
[ -n "$out" ] && : > "$out"
