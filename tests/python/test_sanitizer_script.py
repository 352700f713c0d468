"""The helpers of tools/run_sanitizers.sh (tools/sanitizers/lib.sh): the two
ASan doctest processes split the real test binary's cases with none run twice
or left out, and fuzzing stops a target on a repeated kept input (a mock
findings directory)."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import Skip, run, test  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LIB = os.path.join(ROOT, "tools", "sanitizers", "lib.sh")


def bash(script, *args):
    """Runs script (bash, lib.sh sourced) with args; returns (code, stdout, stderr)."""
    p = subprocess.run(["bash", "-c", 'source "$0"; ' + script, LIB] + list(args), capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def cases(binary, flt):
    """The test cases doctest would run with the filter argument flt ('' for all)."""
    args = [binary, "--list-test-cases", "--no-intro=true"] + ([flt] if flt else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.splitlines()
    # doctest frames the list with "[doctest] ..." and "=====" lines.
    return [l for l in out if l.strip() and not l.startswith("[doctest]") and not l.startswith("====")]


def test_binary():
    b = os.path.join(os.environ.get("ASAP_BUILD_DIR", os.path.join(ROOT, "build")), "tests", "asap_tests")
    if not os.path.exists(b):
        raise Skip("no %s (build the tests first)" % b)
    return b


@test
def two_shards_run_every_case_once():
    binary = test_binary()
    code, out, err = bash('shard_filters 2 "$ASAP_SHARD1_DEFAULT"')
    assert code == 0, err
    filters = out.splitlines()
    assert len(filters) == 2, filters
    every = cases(binary, "")
    one, two = cases(binary, filters[0]), cases(binary, filters[1])
    assert len(every) > 200, len(every)
    assert one and two, (len(one), len(two))
    assert not set(one) & set(two), sorted(set(one) & set(two))[:5]
    assert sorted(one + two) == sorted(every), (len(one), len(two), len(every))
    # The default puts the compile-record and verify files in the first.
    assert any(c.startswith("compile record:") for c in one) and any(c.startswith("verify:") for c in one)
    assert not any(c.startswith("fast:") for c in one)


@test
def one_shard_is_the_whole_suite_and_other_counts_are_refused():
    code, out, _ = bash('shard_filters 1 "$ASAP_SHARD1_DEFAULT"')
    assert code == 0 and out == "\n", repr(out)
    for bad in ("3", "0", "two"):
        code, out, err = bash('shard_filters "$1" x', bad)
        assert code == 2 and out == "", (bad, code, out)
        assert err.strip() == "ASAP_SANITIZE_SHARDS: expected 1 or 2, found '%s'" % bad, err


@test
def a_seed_that_keeps_an_earlier_seeds_input_is_a_repeat():
    a, b = "2d5fb300ec1d0ea8d2b31f93498b4feda8ad200b", "b32cc7639dd12d4802c44f41284cddf8446cb1bd"
    with tempfile.TemporaryDirectory() as d:
        def touch(name):
            open(os.path.join(d, name), "w").close()

        def repeated(target, seed):
            return bash('repeated_input "$1" "$2" "$3"', d, target, str(seed))[0] == 0

        touch("calib-seed1-crash-" + b)
        touch("fuzz_calib.seed1.log")
        assert not repeated("calib", 1)  # the only input so far
        touch("calib-seed3-crash-" + a)
        assert not repeated("calib", 3)  # new bytes
        assert not repeated("calib", 2)  # a seed that kept nothing
        touch("calib-seed13-crash-" + a)
        assert repeated("calib", 13)  # seed 3's bytes again
        assert repeated("calib", 3)
        assert not repeated("calib", 1)  # seed 1 is not seed 13 or 3
        touch("artifact-seed1-crash-" + b)
        assert not repeated("artifact", 1)  # another target's input is not a repeat
        touch("calib-seed20-crash-" + b + ".replay.log")
        assert not repeated("calib", 20)  # logs are not inputs


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
