"""Builds the asap_torch package (pyproject.toml has the metadata).

    python3 -m venv --system-site-packages env
    env/bin/pip install --no-build-isolation .

The Python sources are python/asap_torch. The native part -- the TorchScript
operator library libasap_torch_op.so, libasap.so.0 and the asapc executable --
comes from CMake: build_ext builds the targets asapc and asap_torch_op in a
CMake build directory and installs them with
`cmake --install DIR --component asap_python`, which puts them side by side in
asap_torch/_native with $ORIGIN run paths (src/torch_op/CMakeLists.txt).

Which build directory (docs/decisions.md, "The Python package"):

* $ASAP_BUILD_DIR, when set: an existing, configured build directory (e.g.
  the build/ that tools/setup.sh makes). Its targets are brought up to date
  with `cmake --build` -- a no-op when they already are -- and reused, so the
  install takes seconds instead of rebuilding LibTorch-heavy code.
* otherwise build/pip under the source tree, configured here (Release, no
  tests) on the first install and reused by later ones.

$ASAP_BUILD_JOBS sets the build's parallelism (default: every core).
The LibTorch CMake finds must be the torch this interpreter imports: the
build stops with one sentence when their versions differ.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
NATIVE_FILES = ("libasap_torch_op.so", "libasap.so.0", "asapc")


def fail(msg):
    sys.stderr.write("asap_torch setup: error: %s\n" % msg)
    raise SystemExit(2)


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as fh:
        m = re.search(r"project\(asap VERSION ([0-9.]+)", fh.read())
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        p = re.search(r'^version = "([^"]+)"', fh.read(), re.M)
    if not m or not p or m.group(1) != p.group(1):
        fail("pyproject.toml's version (%s) differs from CMakeLists.txt's project VERSION (%s)"
             % (p and p.group(1), m and m.group(1)))
    return m.group(1)


def run(cmd):
    print("asap_torch setup: " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd)
    if r.returncode != 0:
        fail("'%s' failed with exit code %d (its output is above)" % (" ".join(cmd), r.returncode))


def cache_value(build_dir, key):
    with open(os.path.join(build_dir, "CMakeCache.txt")) as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return line.split("=", 1)[1].strip()
    return None


def check_torch(build_dir):
    """The LibTorch of the build must be the torch this interpreter imports."""
    import torch
    torch_dir = cache_value(build_dir, "Torch_DIR")
    cfg = os.path.join(torch_dir or "", "TorchConfigVersion.cmake")
    if not torch_dir or not os.path.isfile(cfg):
        fail("%s/CMakeCache.txt names no LibTorch (Torch_DIR = %r)" % (build_dir, torch_dir))
    with open(cfg) as fh:
        m = re.search(r'set\(PACKAGE_VERSION "([^"]+)"\)', fh.read())
    lib = m.group(1) if m else None
    py = re.match(r"[0-9]+\.[0-9]+\.[0-9]+", torch.__version__)
    if lib is None or py is None or py.group(0) != lib:
        fail("the build in %s uses LibTorch %s (%s) but %s imports torch %s (%s): build against "
             "the same torch (Debian: python3-torch with libtorch-dev)"
             % (build_dir, lib, torch_dir, sys.executable, torch.__version__, torch.__file__))


class CMakeNative(Extension):
    """Placeholder for the CMake-built files: makes the wheel platform-specific."""

    def __init__(self):
        super().__init__("asap_torch._native", sources=[])


class BuildNative(build_ext):
    def build_extension(self, ext):
        jobs = os.environ.get("ASAP_BUILD_JOBS") or str(os.cpu_count() or 2)
        build_dir = os.environ.get("ASAP_BUILD_DIR")
        if build_dir:
            build_dir = os.path.abspath(build_dir)
            if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
                fail("ASAP_BUILD_DIR=%s is not a configured CMake build directory (no "
                     "CMakeCache.txt): run tools/setup.sh or cmake -S . -B build first" % build_dir)
            src = cache_value(build_dir, "CMAKE_HOME_DIRECTORY")
            if src and os.path.realpath(src) != os.path.realpath(ROOT):
                fail("ASAP_BUILD_DIR=%s was configured from %s, not from %s" % (build_dir, src, ROOT))
            if (cache_value(build_dir, "ASAP_BUILD_TORCH_OP:BOOL") or "ON").upper() in ("OFF", "0",
                                                                                      "FALSE"):
                fail("ASAP_BUILD_DIR=%s was configured with ASAP_BUILD_TORCH_OP=OFF; the package "
                     "needs the operator library" % build_dir)
        else:
            build_dir = os.path.join(ROOT, "build", "pip")
            if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
                run(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                     "-DASAP_BUILD_TESTS=OFF", "-DASAP_BUILD_TORCH_OP=ON"])
        check_torch(build_dir)
        run(["cmake", "--build", build_dir, "--target", "asapc", "asap_torch_op", "-j", jobs])
        staging = os.path.join(os.path.abspath(self.build_temp), "asap_python")
        shutil.rmtree(staging, ignore_errors=True)
        run(["cmake", "--install", build_dir, "--component", "asap_python", "--prefix", staging])
        dest = os.path.join(os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name))),
                            "_native")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for name in NATIVE_FILES:
            src = os.path.join(staging, "asap_torch", "_native", name)
            if not os.path.exists(src):
                fail("cmake --install --component asap_python did not install %s (looked in %s)"
                     % (name, os.path.dirname(src)))
            shutil.copy2(src, os.path.join(dest, name))     # follows libasap.so.0's symlink


project_version()      # pyproject.toml and CMakeLists.txt must agree
setup(
    ext_modules=[CMakeNative()],
    cmdclass={"build_ext": BuildNative},
    # setuptools' own build files go under build/python, beside (not into) CMake's build/
    options={"build": {"build_base": os.path.join("build", "python")}},
    zip_safe=False,
)
