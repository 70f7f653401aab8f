#!/usr/bin/env bash
# tools/bench.sh: build every benchmark in Release (-O3) in build-bench/ and run each one.
#
#   tools/bench.sh                     all benchmarks
#   tools/bench.sh bench_adam          only those whose name is given
#   tools/bench.sh bench_cluster_hosts bench_cluster on 7 hosts (as root): each task in a network namespace
#                                      of its own with its own address on a bridge (tests/launch/netns.sh)
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
# bench_cluster on hosts: the chief in the first namespace; it starts each task in its own.
bench_cluster_hosts() {
    local work
    work=$(mktemp -d)
    source tests/launch/netns.sh
    trap 'remove_hosts; rm -rf "$work"' EXIT
    make_hosts "$work" chief ps-0 ps-1 worker-0 worker-1 worker-2 worker-3
    local list="" host
    for host in chief ps-0 ps-1 worker-0 worker-1 worker-2 worker-3; do
        list+="${list:+,}${host_ns[$host]}=${host_ip[$host]}"
    done
    ip netns exec "${host_ns[chief]}" env PSS_BENCH_HOSTS="$list" ./build-bench/benchmarks/bench_cluster "${bench_args[@]}"
    remove_hosts
    rm -rf "$work"
    trap - EXIT
}
for name in "${names[@]}"; do
    echo "==== $name ===="
    if [[ $name == bench_cluster_hosts ]]; then
        bench_cluster_hosts
    else
        "./build-bench/benchmarks/$name" "${bench_args[@]}"
    fi
done
