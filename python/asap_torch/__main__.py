"""python -m asap_torch: what this installation runs on (the first thing to
paste into a bug report)."""
import os
import sys

import torch

import asap_torch
from asap_torch import _library


def main():
    print("asap_torch: %s (%s)" % (asap_torch.__version__, os.path.dirname(asap_torch.__file__)))
    print("python:     %s (%s)" % (sys.version.split()[0], sys.executable))
    print("torch:      %s (%s)" % (torch.__version__, os.path.dirname(torch.__file__)))
    lib = asap_torch.library_path()
    if lib:
        print("op library: %s" % lib)
    else:
        print("op library: not found (%s): the pure-PyTorch fallback runs" % asap_torch.library_error())
    try:
        print("asapc:      %s" % _library.asapc_path())
    except RuntimeError as e:
        print("asapc:      %s" % e)
    m = asap_torch.machine()
    if m is None:
        print("ISA:        unknown (needs the op library)")
        print("threads:    %d (torch.get_num_threads)" % torch.get_num_threads())
    else:
        print("ISA:        %s (available: %s)" % (m["isa"], ", ".join(m["available_isas"])))
        print("threads:    %d%s" % (m["threads"], "" if m["parallel_build"] else
                                   " (but this build runs at::parallel_for serially)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
