#!/usr/bin/env bash
# tools/fuzz.sh: fuzz what a process decodes from the network or reads from a checkpoint: the wire's frames
# (tests/fuzz/fuzz_frame.cpp), a call's encoded arguments (tests/fuzz/fuzz_call.cpp), a checkpoint's index
# and .npy files (tests/fuzz/fuzz_checkpoint.cpp), and what reaches a ps over TLS: a stranger's handshake
# and frames in TLS records, whole or tampered with (tests/fuzz/fuzz_tls.cpp, seeds in corpus_tls/).
# Builds each with clang's libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer into build-fuzz/, then runs each for a bounded time on a working copy of its
# seed corpus, tests/fuzz/corpus/, corpus_call/ and corpus_checkpoint/ (new inputs it finds stay in
# build-fuzz/).
#
#   tools/fuzz.sh              run each target for 60 s
#   tools/fuzz.sh 600          run each for 600 s
#   tools/fuzz.sh --seeds      rewrite the seed corpora with what the library's encoders and writers make
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
    "$CXX" "${common[@]}" -DPSS_FUZZ_WRITE_SEEDS tests/fuzz/fuzz_call.cpp -o "$build/write_call_seeds"
    mkdir -p tests/fuzz/corpus_call
    rm -f tests/fuzz/corpus_call/*
    "./$build/write_call_seeds" tests/fuzz/corpus_call
    "$CXX" "${common[@]}" -DPSS_FUZZ_WRITE_SEEDS tests/fuzz/fuzz_checkpoint.cpp -o "$build/write_checkpoint_seeds"
    mkdir -p tests/fuzz/corpus_checkpoint
    rm -f tests/fuzz/corpus_checkpoint/*
    "./$build/write_checkpoint_seeds" tests/fuzz/corpus_checkpoint
    exit 0
fi

seconds=${1:-60}
read -r -a extra <<<"${PSS_FUZZ_ARGS:-}"
for target in frame:corpus call:corpus_call checkpoint:corpus_checkpoint tls:corpus_tls; do
    name=${target%%:*} corpus=${target##*:}
    "$CXX" "${common[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        "tests/fuzz/fuzz_$name.cpp" -o "$build/fuzz_$name" -lssl -lcrypto
    mkdir -p "$build/$corpus"
    cp -n "tests/fuzz/$corpus"/* "$build/$corpus/" 2>/dev/null || true
    (cd "$build" && "./fuzz_$name" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "${extra[@]}" "$corpus")
done
