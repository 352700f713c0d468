"""The small runner the Python tests share (no pytest needed).

    from harness import Skip, run, test

    @test
    def something():
        ...                      # raise Skip("why") to skip

    if __name__ == "__main__":
        sys.exit(run(sys.argv[1:]))   # -k SUBSTRING runs only matching tests

Prints one line per test and 'N passed, M failed[, K skipped] (T s)' at the
end; run() returns 1 when any test failed, else SKIPPED (77, ctest's
SKIP_RETURN_CODE for these tests) when any was skipped, so that a skip shows
as one in ctest rather than as a pass.
"""
import time
import traceback
import warnings

TESTS = []
SKIPPED = 77


class Skip(Exception):
    """Raised by a test that cannot run here (missing library, data)."""


def test(fn):
    TESTS.append(fn)
    return fn


def run(argv, ignore_user_warnings=False):
    only = argv[argv.index("-k") + 1] if "-k" in argv else ""
    passed = failed = skipped = 0
    t0 = time.time()
    with warnings.catch_warnings():
        if ignore_user_warnings:
            warnings.simplefilter("ignore", UserWarning)
        for fn in TESTS:
            if only not in fn.__name__:
                continue
            try:
                fn()
            except Skip as e:
                skipped += 1
                print("skip %s: %s" % (fn.__name__, e))
            except Exception:
                failed += 1
                print("FAIL %s\n%s" % (fn.__name__, traceback.format_exc()))
            else:
                passed += 1
                print("ok   %s" % fn.__name__)
    print("%d passed, %d failed%s (%.1f s)" % (passed, failed, ", %d skipped" % skipped if skipped else "",
                                               time.time() - t0))
    return 1 if failed else SKIPPED if skipped else 0
