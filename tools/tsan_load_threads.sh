#!/usr/bin/env bash
# ThreadSanitizer run of concurrent loads (issue 28, item 5; docs/reliability.md).
# Builds tests/tsan/load_threads.cpp with src/lib/io/h5util.cpp and
# src/lib/util/atomic_file.cpp under g++ -fsanitize=thread into build-tsan/
# (about 1 min; LibTorch, libgomp and HDF5 are not instrumented), then loads
# good and damaged artifacts and calibration files from 8 threads at once
# with one intra-op thread. Fails on any TSan report or on any thread whose
# result differs from the main thread's. Not part of tools/run_tests.sh;
# tools/run_sanitizers.sh runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build-tsan
bin=build-tsan/load_threads
hdf5_inc=$(pkg-config --cflags-only-I hdf5-serial 2>/dev/null || echo -I/usr/include/hdf5/serial)
hdf5_libs=$(pkg-config --libs hdf5-serial 2>/dev/null || echo "-L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5")
# shellcheck disable=SC2086
${CXX:-g++} -std=gnu++17 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -DHDF_NO_NAMESPACE -DNO_STATIC_CAST \
  -DOLD_HEADER_FILENAME -Iinclude -Isrc/lib $hdf5_inc \
  tests/tsan/load_threads.cpp src/lib/io/h5util.cpp src/lib/util/atomic_file.cpp -o "$bin" \
  -lhdf5_serial_cpp $hdf5_libs -ltorch_cpu -lc10 -lpthread
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 9000 fuzz/corpus/artifact/two_layers.h5 > "$tmp/cut.h5"
head -c 16000 tests/data/fixtures/vit_calib.h5 > "$tmp/cut_calib.h5"
export OMP_NUM_THREADS=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
"$bin" fuzz/corpus/artifact/two_layers.h5 tests/data/fixtures/vit_calib.h5 "$tmp/cut.h5" "$tmp/cut_calib.h5" \
  fuzz/hdf5-known/artifact/*.h5 fuzz/hdf5-known/calib/*.h5 fuzz/corpus/artifact/theta_2e40.h5 \
  fuzz/corpus/calib/unwritten_chunks.h5 fuzz/corpus/artifact/legacy_vlen_v3.h5
