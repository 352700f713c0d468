#!/usr/bin/env python3
"""Blames one sanitizer/libFuzzer report (the log of a replay in a fresh
process) on asapc or on a known HDF5-internal bug (issue 28, item 3;
docs/reliability.md, "Blame").

    blame.py --root SOURCE_DIR [--known FILE] LOG

Prints one line, "<verdict>: <why>", and exits 0 when the report is
excused, 3 when it is an unlisted report inside HDF5 (a warning for the
stage; --strict makes it 1) and 1 for everything else:

  excused  the report matches a listed (function, error kind) pair of
           tools/sanitizers/hdf5_known.txt (the H-items of
           docs/reliability.md): the error kind is the listed one, the
           innermost frame of the crash stack that is asapc's or HDF5's is
           that HDF5 function (interceptor, libc and LibTorch frames before
           it are passed over), and no other stack of the report (allocated
           by / freed by / leak stacks) names an asapc frame.
  asapc    any report that names an asapc frame where it matters: an asapc
           frame first on the crash stack, or HDF5 touching memory that
           asapc handed it: on an allocation, free or leak stack the
           innermost frame that is asapc's or HDF5's owns the memory (HDF5
           memory allocated while asapc called HDF5 is HDF5's), and asapc
           memory is asapc's fault when HDF5 wrote to it (a too-small buffer
           given to H5Aread / H5Dread), or read it while the asapc function
           that allocated it is still on the crash stack (a buffer handed
           down). A read by HDF5 of asapc memory whose allocating function
           had returned is a wild read from damaged metadata: HDF5's.
  unlisted a report that is not on the list: exit 3 when the crash is
           decided by an HDF5 frame (HDF5 1.10.8's bugs on damaged input are
           an open set, and which one a run meets depends on memory state:
           docs/reliability.md), else 1.
  unreproduced  (with --fallback) the replay did not crash and the fuzzing
           run's report is inside HDF5: exit 3 like an unlisted HDF5 report.
  none     the log holds no report: the input did not crash in a fresh
           process. With --fallback SEED_LOG the report of the fuzzing run
           that kept the input is blamed instead (HDF5's reaction to a
           damaged file depends on its memory state, so a crash inside HDF5
           need not repeat); without it, or when that log holds no report
           either, exit 1.

An asapc frame is one whose source path lies under SOURCE_DIR/src/ or
SOURCE_DIR/fuzz/, or whose function is in namespace asap:: or asapc::.
"""
import argparse
import os
import re
import sys

FRAME = re.compile(r"^\s*#(\d+)\s+0x[0-9a-fA-F]+\s+(?:in\s+)?(.*)$")


def kind_of(log):
    """The error kind of the first report in the log, or None."""
    rules = [
        (r"ERROR: AddressSanitizer: ([\w-]+)", None),
        (r"ERROR: LeakSanitizer: detected memory leaks", "leak"),
        (r"ERROR: libFuzzer: timeout", "timeout"),
        (r"ERROR: libFuzzer: out-of-memory \(malloc\(", "malloc-limit"),
        (r"ERROR: libFuzzer: out-of-memory", "rss-limit"),
        (r"ERROR: libFuzzer: deadly signal", "deadly-signal"),
        (r"runtime error:", "undefined-behavior"),
        (r"ERROR: ThreadSanitizer: ([\w-]+)", None),
        (r"unexpected .* \(not asap::Error\)|unexpected non-std exception", "contract"),
    ]
    best = None
    for pat, kind in rules:
        m = re.search(pat, log)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), kind or m.group(1))
    return best[1] if best else None


def stacks(log):
    """The stacks of the log in order: lists of frame texts. A stack is a run
    of '#N 0x... in ...' lines starting at #0."""
    out, cur = [], None
    for line in log.splitlines():
        m = FRAME.match(line)
        if not m:
            if cur:
                out.append(cur)
                cur = None
            continue
        if m.group(1) == "0" or cur is None:
            if cur:
                out.append(cur)
            cur = []
        cur.append(m.group(2).strip())
    if cur:
        out.append(cur)
    return out


def is_asapc(frame, root):
    if any(os.path.join(root, d) in frame for d in ("src/", "fuzz/")):
        return True
    return bool(re.search(r"(^|[\s(*&<,])asapc?::", frame))


def is_hdf5(frame):
    return "libhdf5" in frame


def function_of(frame):
    """'H5HG_read' from 'H5HG_read (/usr/lib/.../libhdf5_serial.so.103+0x...)';
    '' for an unnamed frame '(/usr/lib/...+0x...)'."""
    return frame.split(" ", 1)[0].split("(", 1)[0]


def load_known(path):
    """[(function, kind, label)] from the known-pairs file."""
    known = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 3:
                raise ValueError("%s: expected 'ID FUNCTION KIND', found %r" % (path, line))
            known.append((parts[1], parts[2], parts[0]))
    return known


def access_of(log):
    """'READ' or 'WRITE' for an ASan access report, else None."""
    m = re.search(r"^(READ|WRITE) of size \d+", log, re.M)
    if m:
        return m.group(1)
    m = re.search(r"The signal is caused by a (READ|WRITE) memory access", log)
    return m.group(1) if m else None


def blame(log, root, known):
    """(verdict, why) for one report log."""
    root = os.path.abspath(root).rstrip("/") + "/"
    kind = kind_of(log)
    st = stacks(log)
    if kind is None:
        return "none", "no sanitizer or libFuzzer report in the log (the input did not crash in a fresh process)"
    if not st:
        return "unlisted", "a %s report with no stack to blame" % kind
    crash, others = st[0], st[1:]
    # The innermost frame that is asapc's or HDF5's decides; interceptors,
    # libc, the C++ runtime and LibTorch frames before it are passed over.
    first = None
    for fr in crash:
        if is_asapc(fr, root):
            return "asapc", "%s with asapc frame '%s' first on the crash stack" % (kind, fr)
        if is_hdf5(fr):
            first = fr
            break
    # Whose memory it is: on each allocation / free / leak stack the innermost
    # frame that is asapc's or HDF5's (past malloc, interceptors, libc) owns
    # it. asapc frames further out only called into HDF5, which allocated.
    # asapc memory touched inside HDF5 is asapc's fault when asapc handed it
    # over: HDF5 wrote to it, or the allocating asapc function is still on
    # the crash stack. A read of asapc memory whose allocating function had
    # returned (an object next to HDF5's chunk, or freed by asapc long
    # before) is a wild read from damaged metadata.
    access = access_of(log)
    on_crash = {function_of(fr) for fr in crash if is_asapc(fr, root)}
    wild = None
    for s in others:
        for fr in s:
            if is_asapc(fr, root):
                if first is None or access != "READ" or function_of(fr) in on_crash:
                    return "asapc", "%s inside %s, on memory allocated or freed by asapc frame '%s'" % (
                        kind, function_of(first) if first else "an uninstrumented library", fr)
                wild = fr
                break
            if is_hdf5(fr):
                break
    if first is None:
        return "unlisted", "%s with no HDF5 or asapc frame on the crash stack" % kind
    # The innermost HDF5 frame with a name: static functions of the
    # uninstrumented library have none, and the exported caller above them
    # is what the list names.
    fn = ""
    for fr in crash[crash.index(first):]:
        if is_asapc(fr, root):
            break
        if is_hdf5(fr) and function_of(fr):
            fn = function_of(fr)
            break
    note = ""
    if wild:
        note = " (a READ of asapc memory allocated by '%s', which had returned: a wild read)" % wild
    for kfn, kkind, label in known:
        if kfn == fn and kkind == kind:
            return "excused", "known HDF5-internal %s in %s (%s, docs/reliability.md)%s" % (kind, fn, label, note)
    return "unlisted", "%s in HDF5 function %s, which is not a listed (function, error kind) pair%s" % (
        kind, fn or "(unnamed)", note)


def exit_status(verdict, why, strict=False):
    """0 excused, 3 unlisted inside HDF5 (1 under strict), 1 otherwise."""
    if verdict == "excused":
        return 0
    inside_hdf5 = verdict == "unreproduced" or (verdict == "unlisted" and " in HDF5 function " in why)
    if inside_hdf5 and not strict:
        return 3
    return 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="asapc's source directory")
    ap.add_argument("--known", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "hdf5_known.txt"))
    ap.add_argument("--fallback", help="the fuzzing run's log, blamed when LOG (the replay) has no report")
    ap.add_argument("--strict", action="store_true", help="an unlisted report inside HDF5 exits 1, not 3")
    ap.add_argument("log")
    a = ap.parse_args(argv)
    known = load_known(a.known)
    with open(a.log, errors="replace") as f:
        verdict, why = blame(f.read(), a.root, known)
    if verdict == "none" and a.fallback:
        with open(a.fallback, errors="replace") as f:
            v2, why2 = blame(f.read(), a.root, known)
        if v2 == "asapc" or (v2 == "unlisted" and exit_status(v2, why2) == 1):
            verdict, why = v2, "did not reproduce in a fresh process; the fuzzing run's report: " + why2
        elif v2 != "none":
            # Inside HDF5 (listed or not): a warning, never excused outright.
            verdict, why = "unreproduced", "inside HDF5, did not reproduce in a fresh process: " + why2
    print("%s: %s" % (verdict, why))
    return exit_status(verdict, why, a.strict)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
