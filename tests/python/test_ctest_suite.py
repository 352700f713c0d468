"""ctest's doctest tests (tests/CMakeLists.txt: one per test file, the test
binary with --source-file) together run every case of the real test binary
once: each lists at least one case, no case is in two, and together they are
the binary's own list. A filter that matched nothing would pass under ctest
unseen, so this is checked here, from the commands ctest itself would run
(ctest --show-only=json-v1)."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import Skip, run, test  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("ASAP_BUILD_DIR", os.path.join(ROOT, "build"))


def listed(command):
    """The cases doctest lists for command (the binary and its arguments)."""
    out = subprocess.run(command + ["--list-test-cases", "--no-intro=true"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return [l for l in out if l.strip() and not l.startswith("[doctest]") and not l.startswith("====")]


@test
def doctest_files_run_every_case_once():
    if not os.path.exists(os.path.join(BUILD, "CTestTestfile.cmake")):
        raise Skip("no ctest files in %s (configure the build first)" % BUILD)
    shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=BUILD, capture_output=True, text=True, check=True)
    tests = [t for t in json.loads(shown.stdout)["tests"] if t["name"].startswith("doctest.")]
    sources = sorted(f[:-4] for f in os.listdir(os.path.join(ROOT, "tests"))
                     if f.startswith("test_") and f.endswith(".cpp"))
    assert sorted(t["name"][len("doctest."):] for t in tests) == sources, [t["name"] for t in tests]
    binary = tests[0]["command"][0]
    every = listed([binary])
    seen = []
    for t in tests:
        mine = listed(t["command"])
        assert mine, "%s lists no test case: %s" % (t["name"], t["command"])
        seen += mine
    # As lists: a case run by two tests appears twice in seen, once in every.
    assert sorted(seen) == sorted(every), sorted(set(every) ^ set(seen)) or "a case runs in two ctest tests"


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
