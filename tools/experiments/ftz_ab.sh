#!/usr/bin/env bash
# Times the fused teacher T = 6 and Sinkhorn T' = 4 with the flush-to-zero and
# denormals-are-zero bits off and on (tools/experiments/ftz_ab.cpp): a gain with
# the bits on means subnormal numbers in the passes (docs/performance.md,
# "Subnormal exponentials"). Since the fast path sets the bits itself on every
# thread that runs heads ("Subnormals on Intel"), the two columns should agree on
# a build of the repo; a gap means a thread runs heads without them. A build
# before that change (ASAP_BUILD, e.g. af1f559) shows what they buy. Builds
# against the repo's headers and the libasap of ASAP_BUILD; x86 only.
#   tools/experiments/ftz_ab.sh [N=17] [D=16] [THREADS=2] [ROUNDS=5] [REPS=201] [QK_SCALE=1]
# ASAP_BUILD: the build directory with libasap.so (default build), e.g. a build
# of 1f2a281, before the exponential's clamp moved.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-17} d=${2:-16} threads=${3:-2} rounds=${4:-5} reps=${5:-201} qk=${6:-1}
build=${ASAP_BUILD:-build}
[ -e "$build/libasap.so" ] || { echo "ftz_ab.sh: expected libasap.so in '$build' (cmake --build $build), found none" >&2; exit 2; }
case "$(uname -m)" in x86_64) ;; *) echo "ftz_ab.sh: expected an x86_64 machine (MXCSR), found $(uname -m)" >&2; exit 2 ;; esac
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
g++ -O2 -std=c++17 -fopenmp -Iinclude -Isrc/lib -I/usr/include/torch/csrc/api/include tools/experiments/ftz_ab.cpp \
  -o "$out/ftz_ab" -L"$build" -lasap -ltorch_cpu -lc10
OMP_WAIT_POLICY=ACTIVE LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$out/ftz_ab" "$n" "$d" "$threads" "$rounds" "$reps" "$qk"
