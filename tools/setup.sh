#!/usr/bin/env bash
# Installs what asapc needs from Debian's packages (when run as root; else
# prints the one apt line to run) and configures + builds into ./build.
# Sourced by tools/run_main.sh and tools/run_tests.sh; safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."

ASAP_APT_PACKAGES=(build-essential cmake libtorch-dev libhdf5-dev nlohmann-json3-dev libcli11-dev libeigen3-dev libgloo-dev
                   doctest-dev libopenblas0-pthread python3-torch python3-h5py python3-numpy python3-matplotlib clang-14 clang-format-14 libfuzzer-14-dev
                   python3-venv python3-pip python3-setuptools python3-wheel)
missing=()
for p in "${ASAP_APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
  else
    echo "setup: missing Debian packages; run as root:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
fi

# Configure and build (Release) with every core.
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > build.log 2>&1 || { cat build.log >&2; exit 2; }
echo "setup: building asapc with $jobs jobs (log: build.log)" >&2
if ! cmake --build build -j "$jobs" >> build.log 2>&1; then
  tail -40 build.log >&2
  echo "setup: build failed (full log: build.log)" >&2
  exit 2
fi
