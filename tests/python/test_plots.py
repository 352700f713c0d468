"""The plots of docs/results.md (tools/train/evaluate.py): every point of the data
is drawn inside its axes, on synthetic results with values far outside the
usual ranges (issue 28, item 8); and the model's speed-up target (issue 25).

    ${PYTHON:-/usr/bin/python3} tests/python/test_plots.py [-k SUBSTRING]
"""
import json
import math
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import Skip, run, test  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "tools"), os.path.join(ROOT, "tools", "train")]
TMP = tempfile.mkdtemp(prefix="asapc-plots-")


def evaluate():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise Skip("python3-matplotlib not installed (tools/setup.sh installs it)")
    import evaluate as ev
    return ev


# Speed-ups from far below the teacher's (0.01x, the 0.43x of a fidelity
# compile) to far above the target (50x); agreements from 0 to 100; an
# untimed point (None) and a NaN, which have no place on the axes.
CURVE = {
    "name": "synthetic", "teacher": "x.pt", "test_examples": 10,
    "points": [
        {"target": "fidelity", "min_speedup": 0.43, "agreement": 99.9, "accuracy": 98.0, "layers": []},
        {"target": "slowest", "min_speedup": 0.01, "agreement": 0.0, "accuracy": 1.0, "layers": []},
        {"target": "1.25", "min_speedup": 1.26, "agreement": 99.4, "accuracy": 98.0, "layers": []},
        {"target": "fastest", "min_speedup": 50.0, "agreement": 100.0, "accuracy": 98.0, "layers": []},
        {"target": "untimed", "min_speedup": None, "agreement": 97.0, "accuracy": 98.0, "layers": []},
        {"target": "nan", "min_speedup": float("nan"), "agreement": 97.0, "accuracy": 98.0, "layers": []},
    ],
    "sinkhorn": [
        {"T": 1, "other_ending": True, "min_speedup": 3.5, "agreement": 12.5, "accuracy": 50.0},
        {"T": 2, "other_ending": False, "min_speedup": 1.77, "agreement": 97.97, "accuracy": 98.0},
        {"T": 3, "other_ending": True, "min_speedup": 0.2, "agreement": 98.5, "accuracy": 98.0},
    ],
}
FINITE_CURVE_POINTS = 4 + 3


def result(curve=CURVE):
    variants = [{"kind": "sinkhorn", "passes": str(t), "agreement": a, "T": t}
                for t, a in ((1, 0.0), (2, 55.0), (3, 97.0), (4, 99.5), (5, 99.1))]
    variants += [{"kind": "asap", "passes": "%d/%d" % (k + 1, k + 2), "agreement": a, "k": k}
                 for k, a in ((1, 80.0), (2, 99.0), (3, 100.0))]
    variants += [{"kind": "asap-kl", "passes": "40", "agreement": 100.0},  # far right of the others
                 {"kind": "compiled", "passes": "4", "agreement": float("nan")}]  # not drawable
    return {"name": "synthetic", "family": "vit", "T": 6, "teacher": "x.pt", "variants": variants,
            "curve": curve}


def drawn_points(fig):
    """(x, y) of every data vertex drawn on the figure's axes."""
    import numpy as np
    out = []
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_transform() == ax.transData:
                out += [tuple(p) for p in np.asarray(line.get_xydata(), float) if np.isfinite(p).all()]
    return out


@test
def speedup_plot_shows_every_point():
    ev = evaluate()
    fig = ev.speedup_figure(result())
    assert ev.points_outside_axes(fig) == [], ev.points_outside_axes(fig)
    pts = drawn_points(fig)
    # Every finite point, and the teacher at 100% is a reference, not a point of this plot.
    assert len(pts) == FINITE_CURVE_POINTS, pts
    for want in ((0.43, 99.9), (0.01, 0.0), (50.0, 100.0), (3.5, 12.5), (0.2, 98.5)):
        assert want in pts, (want, pts)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert lo < 0.01 and hi > 50.0 and lo < 1.0 < ev.MIN_SPEEDUP < hi, (lo, hi)
    ev.pyplot().close(fig)


@test
def passes_plot_shows_every_point():
    ev = evaluate()
    fig = ev.passes_figure([result(), result(curve=None)])
    assert len(fig.axes) == 2
    assert ev.points_outside_axes(fig) == [], ev.points_outside_axes(fig)
    pts = drawn_points(fig)
    # Per panel: 5 Sinkhorn, 3 ASAP, 1 KL, the teacher's star; the NaN compiled point is left out.
    assert len(pts) == 2 * 10, pts
    assert (40.0, 100.0) in pts and (1.0, 0.0) in pts, pts
    ev.pyplot().close(fig)


@test
def a_point_outside_the_axes_is_found_and_refused():
    # The check the two tests above rely on: axes that start at 1x (the old
    # SVG's scale) hide the 0.43x point, and save_figure refuses to write it.
    ev = evaluate()
    fig = ev.speedup_figure(result())
    fig.axes[0].set_xlim(1.0, 60.0)
    bad = ev.points_outside_axes(fig)
    assert {(round(x, 2), y) for _, x, y in bad} == {(0.43, 99.9), (0.01, 0.0), (0.2, 98.5)}, bad
    path = os.path.join(TMP, "bad.png")
    try:
        ev.save_figure(fig, path)
    except RuntimeError as e:
        assert "outside its axes" in str(e), e
    else:
        raise AssertionError("save_figure wrote a plot that hides points")
    assert not os.path.exists(path) and not os.path.exists(path + ".tmp.png")
    ev.pyplot().close(fig)


@test
def figures_are_written_as_png():
    ev = evaluate()
    path = ev.save_figure(ev.speedup_figure(result()), os.path.join(TMP, "images", "s.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert ev.speedup_figure(result(curve=None)) is None
    untimed = dict(CURVE, points=[p for p in CURVE["points"] if not (p["min_speedup"] or 0) > 0 or
                                  math.isnan(p["min_speedup"])], sinkhorn=[])
    assert ev.speedup_figure(result(curve=untimed)) is None  # nothing timed: no plot


@test
def the_model_target_is_the_sum_of_the_layers_latencies():
    """docs/results.md's speed target is the model's: the teachers' summed
    latency over the default operators' (issue 25), from verify's JSON."""
    ev = evaluate()

    def op(kind, steps, lat, err, default=False):
        return {"kind": kind, "steps": steps, "lse_passes": steps, "default": default, "teacher_ending": True,
                "latency_s": lat, "metrics": {"attention_rel_error": err}}

    def verify_json(rows):
        layers = [{"name": n, "T": 6, "default_closures": 2, "fit": {}, "default_operator": "asap", "examples": 8,
                   "operators": [op("teacher", 6, t, 0.0), op("asap", 2, d, 0.1, True),
                                 op("sinkhorn", 4, 0.9 * t, 0.2)]} for n, t, d in rows]
        path = os.path.join(TMP, "verify-%d.json" % len(os.listdir(TMP)))
        with open(path, "w") as f:
            json.dump({"data": "x.h5", "layers": layers}, f)
        return ev.verify_layers(path)

    def lines(ver):
        r = {"family": "vit", "test_examples": 100, "verify": ver, "curve": None,
             "variants": [{"kind": "teacher", "accuracy": 98.0, "passes": "6"},
                          {"kind": "compiled", "default": True, "accuracy": 98.0, "agreement": 99.5, "agree": 99,
                           "passes": "4"}]}
        return "\n".join(ev.targets(r)[2])

    # a: 4 s against 2 s (2x); b: 6 s against 5.5 s (1.09x); the model: 10 s against 7.5 s.
    ver = verify_json([("a", 4.0, 2.0), ("b", 6.0, 5.5)])
    assert abs(ver["model_speedup"] - 10.0 / 7.5) < 1e-12, ver["model_speedup"]
    text = lines(ver)
    assert "the model at least 1.25x faster than the teachers" in text and "**met** (1.33x; per layer 2.00x, 1.09x)" \
        in text, text
    slow = lines(verify_json([("a", 4.0, 3.5), ("b", 6.0, 5.5)]))  # 10 s against 9 s: 1.11x
    assert "**missed** (1.11x;" in slow, slow


if __name__ == "__main__":
    try:
        sys.exit(run(sys.argv[1:]))
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
