"""The C++ tree follows .clang-format (clang-format-14, which tools/setup.sh
installs): every .cpp and .h under src/, include/, tests/, tools/, fuzz/ and
examples/ is already formatted. A file that is not fails with its name and
the first lines clang-format would change."""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import run, test  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DIRS = ("src", "include", "tests", "tools", "fuzz", "examples")


def cxx_files():
    out = []
    for d in DIRS:
        for dirpath, _, names in os.walk(os.path.join(ROOT, d)):
            if "/corpus" in dirpath or "/build" in dirpath:
                continue
            out += [os.path.join(dirpath, n) for n in names if n.endswith((".cpp", ".h"))]
    return sorted(out)


def clang_format():
    exe = shutil.which("clang-format-14") or shutil.which("clang-format")
    assert exe, "clang-format-14 is missing: tools/setup.sh installs it"
    return exe


@test
def the_tree_follows_clang_format():
    exe = clang_format()
    files = cxx_files()
    assert len(files) > 100, len(files)
    bad = []
    for f in files:
        r = subprocess.run([exe, "--style=file", "--dry-run", "-Werror", f], capture_output=True, text=True,
                           cwd=ROOT)
        if r.returncode != 0:
            bad.append("%s:\n%s" % (os.path.relpath(f, ROOT), "\n".join(r.stderr.splitlines()[:6])))
    assert not bad, "%d file(s) not formatted (run: clang-format-14 -i FILE):\n%s" % (len(bad), "\n".join(bad[:5]))


@test
def the_check_finds_a_misformatted_line():
    import tempfile
    exe = clang_format()
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", dir=ROOT, delete=False) as t:
        t.write("int   f( int x ){return x;}\n")
    try:
        r = subprocess.run([exe, "--style=file", "--dry-run", "-Werror", t.name], capture_output=True, text=True,
                           cwd=ROOT)
        assert r.returncode != 0, r.stderr
    finally:
        os.remove(t.name)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
