# shellcheck shell=bash
# Helpers of tools/run_sanitizers.sh, sourced by it and by
# tests/python/test_sanitizer_script.py (which checks them on the real test
# binary and on a mock findings directory).

# The test files of the first of two ASan doctest processes; the second runs
# every other file. About half of the suite's ASan time each (2026-11-28).
# shellcheck disable=SC2034  # used by run_sanitizers.sh
ASAP_SHARD1_DEFAULT='*test_compile_record.cpp,*test_verify.cpp'

# shard_filters SHARDS PATTERN: one line per doctest process, its filter
# argument (an empty line: the whole suite). With 2, the second is the
# exclusion of the first, so every case runs exactly once. Returns 2, with a
# sentence on stderr, for any other count than 1 or 2.
shard_filters() {
  case $1 in
    1) echo "" ;;
    2) printf '%s\n' "--source-file=$2" "--source-file-exclude=$2" ;;
    *) echo "ASAP_SANITIZE_SHARDS: expected 1 or 2, found '$1'" >&2; return 2 ;;
  esac
}

# repeated_input DIR TARGET SEED: true when the input libFuzzer kept for this
# seed (DIR/TARGET-seedSEED-<kind>-<SHA-1 of its bytes>) has the same bytes
# as an input kept for another seed of the target.
repeated_input() {
  local sha
  sha=$(find "$1" -maxdepth 1 -name "$2-seed$3-*" ! -name '*.log' | sed -nE 's/.*-([0-9a-f]{40})$/\1/p' | head -1)
  [ -n "$sha" ] && [ "$(find "$1" -maxdepth 1 -name "$2-seed*-$sha" | wc -l)" -gt 1 ]
}
