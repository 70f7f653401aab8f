#!/usr/bin/env bash
# tools/demo.sh: build and run the demo (examples/demo_train.cpp) in Release. The README's first command.
# Installs missing Debian packages first (apt-get; sudo when not root). Arguments go to the demo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/pss_env.sh

pss_ensure_packages

cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPSS_BUILD_TESTS=OFF -DPSS_BUILD_EXAMPLES=ON -DPSS_BUILD_BENCHMARKS=OFF -DPSS_INSTALL=OFF
cmake --build build-demo -j "$PSS_JOBS" --target demo_train
exec ./build-demo/examples/demo_train "$@"
