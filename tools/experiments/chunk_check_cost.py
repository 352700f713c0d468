#!/usr/bin/env python3
"""What the chunk-record check (h5util::check_chunk_sizes) costs: writes a
calibration file whose one layer has N examples in chunks of one example each
(N chunks), and times `asapc inspect` on it, the least of three runs.
docs/reliability.md, item 9.

    /usr/bin/python3 tools/experiments/chunk_check_cost.py [N ...]   (default 1024 4096 8192)

ASAPC: the asapc binary (default build/asapc). Datasets of more than 4096
chunks are not checked (kMaxCheckedChunks), so their time is the open alone;
to time the check itself past that, raise the constant and rebuild.
"""
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    asapc = os.environ.get("ASAPC", os.path.join(ROOT, "build", "asapc"))
    if not os.access(asapc, os.X_OK):
        sys.exit(f"chunk_check_cost.py: expected an asapc binary at {asapc} (cmake --build build), found none")
    counts = [int(a) for a in sys.argv[1:]] or [1024, 4096, 8192]
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            path = os.path.join(tmp, f"chunks_{n}.h5")
            with h5py.File(path, "w") as f:
                f.attrs["format"] = np.bytes_("asapc-calib")
                f.attrs["version"] = 2
                g = f.create_group("layers").create_group("l0")
                g.create_dataset("x", data=np.ones((n, 2, 4), np.float32), chunks=(1, 2, 4))
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                subprocess.run([asapc, "inspect", path], check=True, stdout=subprocess.DEVNULL)
                best = min(best, time.perf_counter() - t0)
            print(f"{n:8d} chunks: asapc inspect {best:.3f} s")


if __name__ == "__main__":
    main()
