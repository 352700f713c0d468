"""The `asapc` console script of the installed package: runs the asapc
executable it carries (asap_torch/_native/asapc) with the same arguments."""
import os
import sys

from . import _library


def main():
    try:
        exe = _library.asapc_path(use_path=False)
    except RuntimeError as e:
        sys.stderr.write("asapc: error: %s\n" % e)
        return 2
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
