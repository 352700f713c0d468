"""The compile pipeline stays readable: compile_teacher is a short loop over
layers (at most 80 lines) and no function in src/lib/compile/ is over 120
lines. Functions are found as the tree is formatted (.clang-format):
a definition starts in column 0, namespaces are not indented, and its body
ends where its braces balance."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))
from harness import run, test  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COMPILE = os.path.join(ROOT, "src", "lib", "compile")
NOT_FUNCTIONS = ("namespace", "struct", "class", "enum", "using", "template", "#", "}", "//", "constexpr")


def functions(path):
    """(name, first line, lines) of every function defined in column 0 of a file."""
    lines = open(path).read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"^[A-Za-z]", line) and not line.startswith(NOT_FUNCTIONS) and "(" in line \
                and not line.rstrip().endswith(";"):
            j = i  # the line that opens the body
            while j < len(lines) and not lines[j].rstrip().endswith("{") and not lines[j].rstrip().endswith(";"):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{"):
                depth, k = 0, j
                while k < len(lines):
                    depth += lines[k].count("{") - lines[k].count("}")
                    if depth == 0:
                        break
                    k += 1
                name = re.search(r"([\w:~]+)\s*\(", line)
                out.append((name.group(1) if name else line[:40], i + 1, k - i + 1))
                i = k + 1
                continue
        i += 1
    return out


def all_functions():
    out = []
    for name in sorted(os.listdir(COMPILE)):
        if name.endswith(".cpp"):
            out += [(name,) + f for f in functions(os.path.join(COMPILE, name))]
    return out


@test
def no_function_in_compile_is_over_120_lines():
    fs = all_functions()
    assert len(fs) > 40, "found only %d functions: has the layout changed?" % len(fs)
    long = ["%s:%d %s (%d lines)" % (f, ln, n, size) for f, n, ln, size in fs if size > 120]
    assert not long, "over 120 lines: " + ", ".join(long)


@test
def compile_teacher_is_a_short_loop():
    sizes = [size for f, n, ln, size in all_functions() if n == "compile_teacher"]
    assert sizes, "compile_teacher not found in src/lib/compile/"
    assert max(sizes) <= 80, "compile_teacher has %d lines (at most 80)" % max(sizes)


@test
def the_counter_sees_a_long_function():
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as t:
        t.write("namespace a {\n\nint f(int x) {\n" + "  x += 1;\n" * 130 + "  return x;\n}\n\n}  // namespace a\n")
    try:
        (name, line, size), = functions(t.name)
        assert (name, line, size) == ("f", 3, 133), (name, line, size)
    finally:
        os.remove(t.name)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
