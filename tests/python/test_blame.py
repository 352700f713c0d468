"""tools/sanitizers/blame.py on canned reports (issue 28, item 3): an asapc
overflow inside an HDF5 memcpy is blamed on asapc, an unlisted HDF5 report
fails, a listed one with no asapc frame or allocation is excused, and a log
with no report (a crash that did not reproduce) is not excused."""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import run, test  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAN = os.path.join(ROOT, "tools", "sanitizers")
sys.path.insert(0, SAN)
import blame  # noqa: E402

SRC = "/home/ci/asapc"  # the source root the canned reports were "built" in
KNOWN = blame.load_known(os.path.join(SAN, "hdf5_known.txt"))
HDF5 = "/lib/x86_64-linux-gnu/libhdf5_serial.so.103"


def frames(*fs):
    return "\n".join("    #%d 0x%012x in %s" % (i, 0x7f0000001000 + 16 * i, f) for i, f in enumerate(fs))


ASAPC_READ = "asap::detail::h5::read_strings(H5::Attribute const&) %s/src/lib/io/h5util.cpp:118:5" % SRC
FUZZ_MAIN = "LLVMFuzzerTestOneInput %s/fuzz/fuzz_calib.cpp:14:3" % SRC

# H2 as it was seen: memcpy with a garbage length inside H5HG_read; the
# destination is HDF5's own buffer (allocated inside libhdf5).
H2_KNOWN = """==4242==ERROR: AddressSanitizer: memcpy-param-overlap: memory ranges [0x6250000,0x6260000) and [0x6250100, 0x6260100) overlap
%s
%s

0x625000000100 is located 0 bytes inside of 8192-byte region
allocated by thread T0 here:
%s
SUMMARY: AddressSanitizer: memcpy-param-overlap (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0x9d0e2) in __asan_memcpy
""" % (frames("__asan_memcpy (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0x9d0e2)",
              "H5HG_read (%s+0x1a2b3c)" % HDF5, "H5T__conv_vlen (%s+0x2b3c4d)" % HDF5,
              "H5A__read (%s+0x3c4d5e)" % HDF5, ASAPC_READ, FUZZ_MAIN), "",
       frames("malloc (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0xa1f2)",
              "H5FL_blk_malloc (%s+0x11111)" % HDF5, "H5HG__protect (%s+0x22222)" % HDF5))

# The same memcpy inside HDF5, but the overflowed buffer is asapc's: a
# too-small destination that asapc allocated and handed to H5Aread.
ASAPC_OVERFLOW = """==4243==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602000000051 at pc 0x4a1b2c bp 0x7ffd sp 0x7ffd
WRITE of size 64 at 0x602000000051 thread T0
%s

0x602000000051 is located 0 bytes to the right of 1-byte region [0x602000000050,0x602000000051)
allocated by thread T0 here:
%s
SUMMARY: AddressSanitizer: heap-buffer-overflow in __asan_memcpy
""" % (frames("__asan_memcpy (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0x9d0e2)",
              "H5HG_read (%s+0x1a2b3c)" % HDF5, "H5T__conv_vlen (%s+0x2b3c4d)" % HDF5,
              "H5A__read (%s+0x3c4d5e)" % HDF5, ASAPC_READ, FUZZ_MAIN),
       frames("operator new(unsigned long) (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0xf00)",
              "std::vector<char, std::allocator<char> >::vector(unsigned long) /usr/include/c++/12/bits/stl_vector.h:512",
              ASAPC_READ, FUZZ_MAIN))

# An overflow in asapc's own code (no HDF5 frame at all).
ASAPC_OWN = """==1==ERROR: AddressSanitizer: stack-buffer-overflow on address 0x7ffc
READ of size 8 at 0x7ffc thread T0
%s
""" % frames("asap::detail::h5::check_stored(H5::DataSet const&) %s/src/lib/io/h5util.cpp:540:7" % SRC, FUZZ_MAIN)

# H7 as the merge's CI run saw it: strdup past the end of an object-header
# chunk that HDF5 allocated while asapc was opening the file. asapc frames
# stand further out on the allocation stack (asapc called H5Fopen), but the
# memory is HDF5's: the innermost asapc-or-HDF5 frame of that stack is HDF5.
ASAPC_OPEN = "asap::detail::h5::open_file(std::string const&) %s/src/lib/io/h5util.cpp:285:12" % SRC
H7_HDF5_MEMORY = """==6859==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x60d0004726a0 at pc 0x5576 bp 0x7ffd sp 0x7ffd
%s

0x60d0004726a0 is located 0 bytes to the right of 144-byte region [0x60d000472610,0x60d0004726a0)
allocated by thread T0 here:
%s
SUMMARY: AddressSanitizer: heap-buffer-overflow in __interceptor_strdup
""" % (frames("__interceptor_strdup (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0x124f45)",
              "H5MM_strdup (%s+0x18431d)" % HDF5, "(%s+0x190d21)" % HDF5,
              "H5O__msg_iterate_real (%s+0x1b4ca4)" % HDF5, "H5Aexists (%s+0x5c350)" % HDF5, ASAPC_READ,
              FUZZ_MAIN),
       frames("malloc (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0x13a5ce)",
              "(%s+0x1233e4)" % HDF5, "H5FL_blk_malloc (%s+0x123af1)" % HDF5, "H5C_protect (%s+0x8d9fc)" % HDF5,
              "H5Fopen (%s+0xf06db)" % HDF5, ASAPC_OPEN, FUZZ_MAIN))

# A report inside HDF5 that is not on the list (function, kind).
UNLISTED = """==7==ERROR: AddressSanitizer: SEGV on unknown address 0x000000000010 (pc 0x7f00 bp 0x0 sp 0x7ffd T0)
==7==The signal is caused by a READ memory access.
%s
""" % frames("H5O__attr_decode (%s+0x4e5f6)" % HDF5, "H5O_msg_read (%s+0x5f6a7)" % HDF5,
             "H5A__open_common (%s+0x6a7b8)" % HDF5, ASAPC_READ, FUZZ_MAIN)

# H6 as seen: the innermost HDF5 frame is an unnamed static function; the
# named one above it (H5O__msg_iterate_real) is what the list names.
H6_UNNAMED = """==30266==ERROR: AddressSanitizer: SEGV on unknown address 0x60d000482198 (pc 0x7f4a bp 0x7ffd sp 0x7ffd T0)
%s
""" % frames("__memcpy_avx512_unaligned_erms string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S:372",
             "memcpy (/work/build-fuzz/fuzz/fuzz_calib+0xd1b47)", "(%s+0x190f18)" % HDF5,
             "H5O__msg_iterate_real (%s+0x1b4ca4)" % HDF5, "H5O__attr_exists (%s+0x19518c)" % HDF5,
             "H5Aexists (%s+0x5c350)" % HDF5, ASAPC_READ, FUZZ_MAIN)

# A listed function with another error kind is not excused either.
LISTED_FN_OTHER_KIND = UNLISTED.replace("H5O__attr_decode", "H5HG_read")

# H4: libFuzzer's timeout, stack inside H5HG__protect.
H4_TIMEOUT = """ALARM: working on the last Unit for 10 seconds
       and the timeout value is 10 (use -timeout=N to change)
==9== ERROR: libFuzzer: timeout after 10 seconds
%s
SUMMARY: libFuzzer: timeout
""" % frames("__sanitizer_print_stack_trace (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0xb1)",
             "fuzzer::PrintStackTrace() (/work/build-fuzz/fuzz/fuzz_artifact+0x4c8e21)",
             "H5HG__protect (%s+0x22222)" % HDF5, "H5HG_read (%s+0x1a2b3c)" % HDF5, ASAPC_READ, FUZZ_MAIN)

# A UBSan report in asapc.
UBSAN = """%s/src/lib/io/artifact.cpp:300:20: runtime error: signed integer overflow: 4611686018427387904 * 4 cannot be represented in type 'long'
%s
""" % (SRC, frames("asap::(anonymous namespace)::check_layer_shapes(...) %s/src/lib/io/artifact.cpp:300:20" % SRC,
                   FUZZ_MAIN))

# A wild read inside HDF5 that lands next to an asapc object allocated
# earlier (the calibration reader's Part, whose allocating function had
# returned): damaged metadata sent HDF5's memcpy there, asapc handed it
# nothing (the merge's CI run, fuzz_calib -seed=1, 2026-11-25).
ASAPC_PART = ("std::unique_ptr<asap::(anonymous namespace)::Part> std::make_unique<asap::(anonymous namespace)::Part>"
              "(std::string const&, H5::H5File&&) /usr/include/c++/12/bits/unique_ptr.h:1065:30")
ASAPC_OPEN_PART = "asap::(anonymous namespace)::open_part(std::string const&) %s/src/lib/io/calib.cpp:86:15" % SRC
WILD_READ = """==17318==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x60d00047cf58 at pc 0x5646 bp 0x7ffe sp 0x7ffe
READ of size 4096 at 0x60d00047cf58 thread T0
%s

0x60d00047cf58 is located 8 bytes to the right of 128-byte region [0x60d00047ced0,0x60d00047cf50)
allocated by thread T0 here:
%s
SUMMARY: AddressSanitizer: heap-buffer-overflow in memcpy
""" % (frames("memcpy (/work/build-fuzz/fuzz/fuzz_calib+0xd19d3)", "(%s+0x190f18)" % HDF5,
              "H5VM_memcpyvv (%s+0x22b0c1)" % HDF5, "H5D__compact_readvv (%s+0xa1b2c)" % HDF5,
              "H5Dread (%s+0x9e001)" % HDF5, "asap::CalibFile::read(std::string const&, long, long) %s/src/lib/io/calib.cpp:330:9" % SRC,
              FUZZ_MAIN),
       frames("operator new(unsigned long) (/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0xf00)",
              ASAPC_PART, ASAPC_OPEN_PART, FUZZ_MAIN))
# The same access as a WRITE: HDF5 wrote into asapc memory, asapc's fault.
WILD_WRITE = WILD_READ.replace("READ of size", "WRITE of size")
# A READ of an asapc buffer whose allocating function is on the crash stack
# (it handed the buffer down): asapc's.
HANDED_READ = ASAPC_OVERFLOW.replace("WRITE of size", "READ of size")

# The log of a replay that did not crash.
NO_REPORT = """INFO: Running with entropic power schedule (0xFF, 100).
INFO: Seed: 1
Running: build-fuzz/findings/calib-crash-0123
Executed build-fuzz/findings/calib-crash-0123 in 12 ms
***
*** NOTE: fuzzing was not performed, you have only
***       executed the target code on a fixed set of inputs.
***
"""


def verdict(log):
    return blame.blame(log, SRC, KNOWN)


@test
def asapc_overflow_inside_hdf5_memcpy_is_blamed_on_asapc():
    v, why = verdict(ASAPC_OVERFLOW)
    assert v == "asapc", (v, why)
    assert "read_strings" in why, why


@test
def unlisted_hdf5_report_is_not_excused():
    v, why = verdict(UNLISTED)
    assert v == "unlisted" and "H5O__attr_decode" in why and "SEGV" in why, (v, why)
    v, why = verdict(LISTED_FN_OTHER_KIND)
    assert v == "unlisted" and "H5HG_read" in why, (v, why)


@test
def listed_hdf5_reports_without_asapc_memory_are_excused():
    v, why = verdict(H2_KNOWN)
    assert v == "excused" and "H2" in why, (v, why)
    v, why = verdict(H4_TIMEOUT)
    assert v == "excused" and "H4" in why and "timeout" in why, (v, why)
    v, why = verdict(H6_UNNAMED)
    assert v == "excused" and "H6" in why and "H5O__msg_iterate_real" in why, (v, why)
    # HDF5's memory although asapc called the function that allocated it.
    v, why = verdict(H7_HDF5_MEMORY)
    assert v == "excused" and "H7" in why and "H5MM_strdup" in why, (v, why)


@test
def asapc_frames_and_ub_are_asapc():
    assert verdict(ASAPC_OWN)[0] == "asapc"
    v, why = verdict(UBSAN)
    assert v == "asapc" and why.startswith("undefined-behavior"), (v, why)


@test
def wild_read_of_asapc_memory_inside_hdf5_is_hdf5s_but_a_write_or_handed_buffer_is_asapcs():
    v, why = verdict(WILD_READ)
    assert v == "unlisted" and "H5VM_memcpyvv" in why and "wild read" in why, (v, why)
    assert blame.exit_status(v, why) == 3 and blame.exit_status(v, why, strict=True) == 1
    v, why = verdict(WILD_WRITE)
    assert v == "asapc" and "make_unique" in why, (v, why)
    v, why = verdict(HANDED_READ)
    assert v == "asapc" and "read_strings" in why, (v, why)


@test
def no_report_is_not_excused():
    assert verdict(NO_REPORT)[0] == "none"


@test
def command_line_exit_status():
    with tempfile.TemporaryDirectory() as d:
        def cli(log, *extra, fallback=None):
            p = os.path.join(d, "r.log")
            with open(p, "w") as f:
                f.write(log)
            args = list(extra)
            if fallback is not None:
                fp = os.path.join(d, "seed.log")
                with open(fp, "w") as f:
                    f.write(fallback)
                args += ["--fallback", fp]
            r = subprocess.run([sys.executable, os.path.join(SAN, "blame.py"), "--root", SRC] + args + [p],
                               capture_output=True, text=True)
            return r.returncode, r.stdout, r.stderr

        # 0 excused, 3 unlisted inside HDF5 (a warning; 1 with --strict), 1 else.
        for log, extra, code, word in ((H2_KNOWN, (), 0, "excused"), (ASAPC_OVERFLOW, (), 1, "asapc"),
                                       (UNLISTED, (), 3, "unlisted"), (UNLISTED, ("--strict",), 1, "unlisted"),
                                       (WILD_READ, (), 3, "unlisted"), (NO_REPORT, (), 1, "none")):
            rc, out, err = cli(log, *extra)
            assert rc == code and out.startswith(word + ": "), (word, extra, rc, out, err)
        # A replay with no report falls back to the fuzzing run's report:
        # inside HDF5 (listed or not) it is a warning, asapc's fails, and no
        # report in either fails.
        for seed, code, word in ((H6_UNNAMED, 3, "unreproduced"), (UNLISTED, 3, "unreproduced"),
                                 (ASAPC_OWN, 1, "asapc"), (NO_REPORT, 1, "none")):
            rc, out, err = cli(NO_REPORT, fallback=seed)
            assert rc == code and out.startswith(word + ": "), (word, rc, out, err)
        rc, out, _ = cli(NO_REPORT, "--strict", fallback=H6_UNNAMED)
        assert rc == 1 and out.startswith("unreproduced: "), (rc, out)


@test
def listed_pairs_are_the_ones_docs_list():
    with open(os.path.join(ROOT, "docs", "reliability.md")) as f:
        doc = f.read()
    for fn, kind, label in KNOWN:
        assert re.search(r"\|\s*%s\s*\|\s*`%s`\s*\|\s*`%s`\s*\|" % (label, re.escape(fn), re.escape(kind)), doc), \
            "docs/reliability.md does not list (%s, %s) for %s" % (fn, kind, label)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
