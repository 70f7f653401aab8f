#!/usr/bin/env bash
# tools/demo.sh: the README's first command. Splits the UCI handwritten digits that Debian's python3-sklearn
# ships and trains scikit-learn's LogisticRegression on them as the reference (tools/digits.py), then builds
# the demo (examples/demo_train.cpp) in Release and trains it on the same split: two held-out accuracies.
# Installs missing Debian packages first (apt-get; sudo when not root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/pss_env.sh

pss_ensure_packages python3-sklearn

cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPSS_BUILD_TESTS=OFF -DPSS_BUILD_EXAMPLES=ON -DPSS_BUILD_BENCHMARKS=OFF -DPSS_INSTALL=OFF
cmake --build build-demo -j "$PSS_JOBS" --target demo_train
/usr/bin/python3 tools/digits.py build-demo/digits
exec ./build-demo/examples/demo_train build-demo/digits
