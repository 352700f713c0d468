#!/usr/bin/env bash
# The whole test suite: set up, build, then every C++ and Python test via ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
cd build
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)"
