#!/usr/bin/env bash
# tools/bench.sh: build every benchmark in Release (-O3) in build-bench/ and run each one.
#
#   tools/bench.sh                     all benchmarks
#   tools/bench.sh bench_adam          only those whose name is given
#   PSS_BENCHMARK_FLAGS=-march=x86-64-v3 tools/bench.sh    extra compile flags for the benchmarks
#   PSS_BENCH_ARGS="--benchmark_repetitions=3" tools/bench.sh   arguments for each benchmark program
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/pss_env.sh

pss_ensure_packages

cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPSS_BUILD_TESTS=OFF -DPSS_BUILD_EXAMPLES=OFF -DPSS_BUILD_BENCHMARKS=ON -DPSS_INSTALL=OFF \
    "-DPSS_BENCHMARK_FLAGS=${PSS_BENCHMARK_FLAGS:-}"
cmake --build build-bench -j "$PSS_JOBS" --target pss_benchmarks

read -r -a bench_args <<<"${PSS_BENCH_ARGS:-}"
names=("$@")
if ((${#names[@]} == 0)); then
    for source in benchmarks/*.cpp; do
        [[ -e $source ]] || continue
        names+=("$(basename "$source" .cpp)")
    done
fi
if ((${#names[@]} == 0)); then
    echo "pss: no benchmarks/*.cpp to run"
    exit 0
fi
for name in "${names[@]}"; do
    echo "==== $name ===="
    "./build-bench/benchmarks/$name" "${bench_args[@]}"
done
