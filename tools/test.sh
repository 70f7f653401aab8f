#!/usr/bin/env bash
# tools/test.sh: configure, build and run every pss test. The command the README gives; .ci/run runs it.
#
#   tools/test.sh          both of the next two, in order (what CI runs)
#   tools/test.sh plain    build/        (Debug without -g, g++) all tests, examples, benchmarks (built, not run)
#   tools/test.sh clang    build-clang/  (Debug without -g, clang++) the doctest suite and the launched clusters of tests/launch
#   tools/test.sh asan     build-asan/   the same as plain under AddressSanitizer + UndefinedBehaviorSanitizer
#   tools/test.sh tsan     build-tsan/   the same as plain under ThreadSanitizer
#
# Extra arguments after the mode go to ctest (e.g. `tools/test.sh plain -L net`, `-LE consumer`).
# Installs missing Debian packages first (apt-get; sudo when not root). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/pss_env.sh

mode=${1:-all}
if (($# > 0)); then shift; fi
if [[ $mode == all ]]; then
    bash tools/test.sh plain "$@"
    exec bash tools/test.sh clang "$@"
fi
# plain and clang build without debug information (-g0): they build to test, not to step through, and -g
# made the doctest suite's translation units compile about 40% longer (test_checkpoint.cpp: 55.5 s of CPU
# at -g0, 76.7 s at -g). The sanitizer builds keep -g: their reports name the lines.
no_debug_info=(-DCMAKE_CXX_FLAGS_DEBUG=-g0)
# plain and clang link with lld: a program of pss linked in 0.56 s against GNU ld's 3.98 (embedding_ctr,
# 2026-12-05), and the two builds link 39 programs; CI's 35 minutes on 2 cores have little room.
fast_link=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld)
compiler=() extra=() packages=()
case "$mode" in
    plain) build=build; sanitize=""; packages=(python3-numpy python3-yaml python3-sklearn iproute2 slurm-wlm munge openmpi-bin lld)
           # The benchmarks are built to prove they compile (tools/bench.sh builds them header-only for the
           # figures): linked with the runtime compiled once, they compile in about 0.8 of the time.
           extra=("${no_debug_info[@]}" "${fast_link[@]}" -DPSS_BENCHMARKS_COMPILED=ON) ;;
    clang) build=build-clang; sanitize=""; packages=(clang python3-numpy iproute2 lld)
           compiler=(-DCMAKE_CXX_COMPILER=clang++)
           # The g++ build covers the examples, header checks, benchmarks and consumers; clang proves the
           # code (every header through the doctest suite, processes through tests/launch). CI's time
           # budget (35 min on 2 cores) has no room for compiling the examples twice.
           extra=("${no_debug_info[@]}" "${fast_link[@]}" -DPSS_BUILD_EXAMPLES=OFF -DPSS_BUILD_BENCHMARKS=OFF -DPSS_HEADER_CHECKS=OFF -DPSS_INSTALL=OFF
                  -DPSS_TEST_CONSUMERS=OFF) ;;
    asan) build=build-asan; sanitize="address,undefined"; extra=(-DCMAKE_CXX_FLAGS_DEBUG=-g) ;;
    tsan) build=build-tsan; sanitize="thread"; extra=(-DCMAKE_CXX_FLAGS_DEBUG=-g) ;;
    *) echo "usage: tools/test.sh [all|plain|clang|asan|tsan] [ctest arguments...]" >&2; exit 2 ;;
esac

pss_ensure_packages "${packages[@]}"

cmake -S . -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Debug \
    -DPSS_BUILD_TESTS=ON -DPSS_BUILD_EXAMPLES=ON -DPSS_BUILD_BENCHMARKS=ON \
    "-DPSS_SANITIZE=$sanitize" "${compiler[@]}" "${extra[@]}"
cmake --build "$build" -j "$PSS_JOBS"
cd "$build"
set +e
ctest --output-on-failure -j "$PSS_JOBS" "$@" 2>&1 | tee ctest.log
status=${PIPESTATUS[0]}
set -e
# ctest's summary line once more, last, where a reader (or CI log tail) looks for it.
grep -E '^[0-9]+% tests passed' ctest.log | tail -n 1 || echo "ctest printed no summary (exit status $status)"
exit "$status"
