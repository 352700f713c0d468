#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds examples/ against it
# with find_package(asap), then runs the example on an artifact.
set -euo pipefail
build=$1 src=$2 artifact=$3
prefix=$(mktemp -d) work=$(mktemp -d)
trap 'rm -rf "$prefix" "$work"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
cmake -S "$src" -B "$work" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$work" -j 2 > /dev/null
LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}" "$work/asap_example" "$artifact"
