#!/usr/bin/env python3
"""Converts asapc files written before issue 28 (artifact format_version 1-3,
calibration files of version 1) to the current form: every variable-length
string (attribute or scalar string dataset, such as an artifact's fit_json)
becomes a fixed-length, NUL-padded UTF-8 string, and the version goes up
(artifact format_version 4, calibration version 2). Nothing else changes.

    /usr/bin/python3 tools/h5_fixed_strings.py FILE [FILE ...]

asapc itself refuses variable-length strings: HDF5 1.10 follows their
pointers into the file's global heap and can crash, hang or allocate
gigabytes when that heap is damaged (docs/reliability.md, H2-H4). This tool
does read them, through h5py and the same HDF5, so run it only on files you
trust (your own artifacts and recordings), never on files from elsewhere;
for those, compile or record again. See docs/decisions.md.

Each file is converted in a copy next to it, which then replaces it (a file
that fails is left unchanged). Exit 0 when every file was converted or was
already current, 2 on the first error (one line on stderr).
"""
import os
import shutil
import sys

try:
    import h5py
    import numpy as np
except ImportError as exc:  # pragma: no cover - depends on the interpreter
    sys.stderr.write("h5_fixed_strings.py: %s; run it with Debian's /usr/bin/python3\n" % exc)
    sys.exit(2)

# format attribute -> (version attribute, the version with fixed-length strings)
VERSIONS = {"asapc-artifact": ("format_version", 4), "asapc-calib": ("version", 2)}


def _fixed(value):
    """A str or a list of str as a fixed-length string array."""
    if isinstance(value, (list, tuple, np.ndarray)) and not isinstance(value, (str, bytes)):
        items = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.ravel(value)]
        enc = [v.encode("utf-8") for v in items]
        width = max([1] + [len(b) for b in enc])
        return np.array(enc, dtype="S%d" % width).reshape(np.shape(value))
    b = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return np.array(b, dtype="S%d" % max(1, len(b)))


def _is_vlen(tid):
    return tid.get_class() == h5py.h5t.STRING and tid.is_variable_str()


def _convert_attrs(obj):
    n = 0
    for key in list(obj.attrs.keys()):
        if _is_vlen(obj.attrs.get_id(key).get_type()):
            value = obj.attrs[key]
            del obj.attrs[key]
            obj.attrs.create(key, _fixed(value))
            n += 1
    return n


def convert(path):
    """Converts `path` in place; returns the number of strings rewritten."""
    if not os.path.isfile(path):
        raise ValueError("%s: no such file" % path)
    if not h5py.is_hdf5(path):
        raise ValueError("%s: not an HDF5 file" % path)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, ".%s.fixed-strings.tmp" % os.path.basename(path))
    shutil.copyfile(path, tmp)
    try:
        count = 0
        with h5py.File(tmp, "r+") as f:
            fmt = f.attrs.get("format")
            fmt = fmt.decode("utf-8") if isinstance(fmt, bytes) else str(fmt)
            if fmt not in VERSIONS:
                raise ValueError("%s: root attribute 'format' is %r, expected one of %s"
                                 % (path, fmt, ", ".join(sorted(VERSIONS))))
            objects = [f]
            f.visititems(lambda name, obj: objects.append(obj))
            for obj in objects:
                count += _convert_attrs(obj)
            for obj in objects:
                if isinstance(obj, h5py.Dataset) and _is_vlen(obj.id.get_type()):
                    if obj.shape != ():
                        raise ValueError("%s: dataset '%s' is an array of variable-length strings, which no "
                                         "asapc file holds" % (path, obj.name))
                    value = obj[()]
                    parent, name = obj.parent, obj.name.rsplit("/", 1)[-1]
                    attrs = {k: obj.attrs[k] for k in obj.attrs.keys()}
                    del parent[name]
                    parent.create_dataset(name, data=_fixed(value))
                    for k, v in attrs.items():
                        parent[name].attrs[k] = v
                    count += 1
            key, version = VERSIONS[fmt]
            old = int(f.attrs.get(key, 0))
            if old < version:
                f.attrs[key] = np.int64(version)
        os.replace(tmp, path)
        return count
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(__doc__)
        return 0 if argv else 2
    for path in argv:
        try:
            n = convert(path)
        except (ValueError, OSError) as e:
            sys.stderr.write("h5_fixed_strings.py: %s\n" % e)
            return 2
        print("%s: %d variable-length strings made fixed-length" % (path, n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
