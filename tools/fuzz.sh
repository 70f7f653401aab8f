#!/usr/bin/env bash
# tools/fuzz.sh: fuzz the wire decoder. Builds tests/fuzz/fuzz_frame.cpp with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer into build-fuzz/, then runs it for a bounded time on
# a working copy of the seed corpus tests/fuzz/corpus/ (new inputs it finds stay in build-fuzz/corpus/).
#
#   tools/fuzz.sh              run for 60 s
#   tools/fuzz.sh 600          run for 600 s
#   tools/fuzz.sh --seeds      rewrite tests/fuzz/corpus/ with the frames the library's encoder makes
#   PSS_FUZZ_ARGS="-jobs=2" tools/fuzz.sh    extra libFuzzer flags
#
# Needs clang++ and its runtime (Debian: clang, libclang-rt-<version>-dev). Exits non-zero when the fuzzer
# finds a crash, a leak or undefined behaviour; the input that caused it is left as build-fuzz/crash-*.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CXX=${PSS_FUZZ_CXX:-clang++}
build=build-fuzz
mkdir -p "$build"
common=(-std=c++20 -g -O1 -pthread -DXTENSOR_USE_XSIMD -DASIO_HAS_CO_AWAIT=1 -I include
        -Wall -Wextra -Wpedantic -Werror)

if [[ ${1:-} == --seeds ]]; then
    "$CXX" "${common[@]}" -DPSS_FUZZ_WRITE_SEEDS tests/fuzz/fuzz_frame.cpp -o "$build/write_seeds"
    rm -f tests/fuzz/corpus/*
    "./$build/write_seeds" tests/fuzz/corpus
    exit 0
fi

seconds=${1:-60}
"$CXX" "${common[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    tests/fuzz/fuzz_frame.cpp -o "$build/fuzz_frame"
mkdir -p "$build/corpus"
cp -n tests/fuzz/corpus/* "$build/corpus/" 2>/dev/null || true
read -r -a extra <<<"${PSS_FUZZ_ARGS:-}"
cd "$build"
./fuzz_frame -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    "${extra[@]}" corpus
