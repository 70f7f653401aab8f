#!/usr/bin/env bash
# tools/sanitize.sh: run every test under ASan+UBSan (build-asan/), then under TSan (build-tsan/).
# Arguments go to ctest, e.g. `tools/sanitize.sh -LE consumer`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/test.sh asan "$@"
bash tools/test.sh tsan "$@"
