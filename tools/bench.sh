#!/usr/bin/env bash
# tools/bench.sh: build every benchmark in Release (-O3) in build-bench/ and run each one.
#
#   tools/bench.sh                     all benchmarks
#   tools/bench.sh bench_adam          only those whose name is given
#   tools/bench.sh bench_cluster_hosts bench_cluster on 7 hosts (as root): each task in a network namespace
#                                      of its own with its own address on a bridge (tests/launch/netns.sh)
#   tools/bench.sh bench_tcp_link      bench_tcp on a link of PSS_BENCH_RATE (default 10gbit; as root): the
#                                      program and its ps process in a network namespace of their own whose
#                                      loopback a token bucket holds to that rate (where compression pays)
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
# bench_tcp in a namespace of its own, its loopback held to PSS_BENCH_RATE (tc's token bucket filter).
bench_tcp_link() {
    local ns="pss-bench-link-$$" rate="${PSS_BENCH_RATE:-10gbit}"
    trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$rate" burst 4mb latency 200ms
    echo "loopback of $ns held to $rate"
    ip netns exec "$ns" ./build-bench/benchmarks/bench_tcp "${bench_args[@]}"
    ip netns del "$ns"
    trap - EXIT
}
for name in "${names[@]}"; do
    echo "==== $name ===="
    if [[ $name == bench_cluster_hosts ]]; then
        bench_cluster_hosts
    elif [[ $name == bench_tcp_link ]]; then
        bench_tcp_link
    else
        "./build-bench/benchmarks/$name" "${bench_args[@]}"
    fi
done
