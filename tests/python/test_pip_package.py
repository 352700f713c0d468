#!/usr/bin/env python3
"""The asap_torch package as a user installs it (docs/python.md):

    python3 -m venv --system-site-packages env
    env/bin/pip install --no-build-isolation .

in a fresh venv outside the repository, offline (--no-index), reusing the
build directory's targets ($ASAP_BUILD_DIR, set by tests/CMakeLists.txt;
else the folder of $ASAPC). Then, from a temporary directory outside the
repository and with no variable pointing into it, the ten-line example of
docs/python.md (taken from the page itself) on the bundled teacher: record,
compile, patch, and predictions that agree with the teacher's on >= 99% of
the bundled held-out images. Then `python -m asap_torch`, the `asapc`
console script, and `pip uninstall`, which must leave nothing behind.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import harness
from harness import Skip, test

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")
WORK = tempfile.mkdtemp(prefix="asap_pip_test_")
ENV_DIR = os.path.join(WORK, "env")
RUN_DIR = os.path.join(WORK, "run")
EXAMPLE_FILES = ("vit_mnist_t6.pt", "vit_mnist_t6.images.npz")


def build_dir():
    if os.environ.get("ASAP_BUILD_DIR"):
        return os.environ["ASAP_BUILD_DIR"]
    if os.environ.get("ASAPC"):
        return os.path.dirname(os.path.abspath(os.environ["ASAPC"]))
    return os.path.join(REPO, "build")


def clean_env(**extra):
    """The environment of a user: nothing points into the repository."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASAPC", "ASAP_TORCH_OP", "ASAP_BUILD_DIR", "PYTHONPATH",
                        "ASAP_TORCH_BACKEND")}
    env.update(extra)
    return env


def sh(cmd, cwd, env, timeout=900):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (" ".join(cmd), r.returncode,
                                                           r.stdout[-3000:], r.stderr[-3000:])
    return r


def doc_example(path):
    """The python block between <!-- example:begin --> and <!-- example:end -->."""
    with open(path) as f:
        text = f.read()
    m = re.search(r"<!-- example:begin -->\s*```python\n(.*?)```\s*<!-- example:end -->", text, re.S)
    assert m, "%s has no example between the markers" % path
    return m.group(1)


def site_packages():
    out = subprocess.run([os.path.join(ENV_DIR, "bin", "python"), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return out


@test
def test_install_example_uninstall():
    bdir = build_dir()
    if not os.path.isfile(os.path.join(bdir, "CMakeCache.txt")):
        raise Skip("no configured build directory at %s" % bdir)
    # 1. a fresh venv that sees Debian's torch, and the offline install
    sh([PYTHON, "-m", "venv", "--system-site-packages", ENV_DIR], WORK, clean_env())
    pip = os.path.join(ENV_DIR, "bin", "pip")
    t0 = time.monotonic()
    r = sh([pip, "install", "-v", "--no-cache-dir", "--no-build-isolation", "--no-index", REPO], WORK,
           clean_env(ASAP_BUILD_DIR=bdir))
    print("     pip install took %.1f s (build directory %s reused)" % (time.monotonic() - t0, bdir))
    # the install reuses the build's targets: nothing is compiled again
    log = r.stdout + r.stderr          # pip -v shows the build's output
    assert "cmake --install %s --component asap_python" % bdir in log, log[-3000:]
    rebuilt = [s for s in log.split("\n") if "Building CXX object" in s]
    assert rebuilt == [], rebuilt[:5]
    site = site_packages()
    pkg = os.path.join(site, "asap_torch")
    for f in ("libasap_torch_op.so", "libasap.so.0", "asapc"):
        assert os.path.isfile(os.path.join(pkg, "_native", f)), f

    # 2. the ten-line example of docs/python.md, run outside the repository
    os.makedirs(RUN_DIR)
    for f in EXAMPLE_FILES:
        shutil.copy(os.path.join(REPO, "calib_data", f), RUN_DIR)
    # the model's own code, as a user has it beside their script
    shutil.copy(os.path.join(REPO, "tools", "sinkformer_models.py"), RUN_DIR)
    code = doc_example(os.path.join(REPO, "docs", "python.md"))
    lines = [s for s in code.strip().split("\n")]
    assert len(lines) == 10, "the docs' first example has %d lines, not ten" % len(lines)
    assert doc_example(os.path.join(REPO, "README.md")) == code, \
        "README.md and docs/python.md show different first examples"
    with open(os.path.join(RUN_DIR, "example.py"), "w") as f:
        f.write(code)
        # where everything came from: the venv, not the repository
        f.write("import json; print('WHERE', json.dumps([asap_torch.__file__, "
                "asap_torch.library_path(), asap_torch.asapc_path(), art.backend]))\n")
    py = os.path.join(ENV_DIR, "bin", "python")
    r = sh([py, "example.py"], RUN_DIR, clean_env())
    m = re.search(r"^agreement ([0-9.]+)$", r.stdout, re.M)
    assert m, r.stdout + r.stderr
    agreement = float(m.group(1))
    print("     example: agreement with the teacher %.4f on 256 held-out images" % agreement)
    assert agreement >= 0.99, r.stdout
    import json
    where = json.loads(re.search(r"^WHERE (.*)$", r.stdout, re.M).group(1))
    assert [os.path.realpath(w).startswith(os.path.realpath(site)) for w in where[:3]] == \
        [True] * 3, where
    assert where[3] == "op", where
    for f in ("calib.h5", "model.asap.h5"):
        assert os.path.isfile(os.path.join(RUN_DIR, f)), f
    assert not os.path.exists(os.path.join(RUN_DIR, "asap_torch")), "the example ran a local copy"

    # 3. python -m asap_torch and the asapc console script
    r = sh([py, "-m", "asap_torch"], RUN_DIR, clean_env())
    info = dict(re.findall(r"^([^:\n]+): +(.*)$", r.stdout, re.M))
    assert info["asap_torch"] == "0.1.0 (%s)" % pkg, r.stdout
    assert info["op library"] == os.path.join(pkg, "_native", "libasap_torch_op.so"), r.stdout
    assert re.match(r"(generic|avx2|avx512) \(available: ", info["ISA"]), r.stdout
    assert re.match(r"[1-9][0-9]* ?", info["threads"]), r.stdout
    r = sh([os.path.join(ENV_DIR, "bin", "asapc"), "--version"], RUN_DIR, clean_env())
    assert r.stdout.strip() == "asapc 0.1.0", r.stdout

    # 4. pip uninstall removes the package, its native files and the script
    sh([pip, "uninstall", "-y", "asap-torch"], WORK, clean_env())
    left = [f for f in os.listdir(site) if f.lower().startswith(("asap_torch", "asap-torch"))]
    assert left == [], left
    assert not os.path.exists(os.path.join(ENV_DIR, "bin", "asapc"))
    r = subprocess.run([py, "-c", "import asap_torch"], cwd=RUN_DIR, env=clean_env(),
                       capture_output=True, text=True)
    assert r.returncode != 0 and "No module named 'asap_torch'" in r.stderr, r.stderr


if __name__ == "__main__":
    try:
        code = harness.run(sys.argv[1:])
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    sys.exit(code)
