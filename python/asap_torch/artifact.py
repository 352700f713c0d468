"""Reading an asapc artifact (docs/artifact-format.md) with h5py.

The pure-PyTorch operator (reference.py) needs the teacher conventions, the
operator kind, the slice bank, the feature family and the coefficients of
each compiled layer; the custom operator reads the same file itself in C++.
Checks here are the ones the Python side relies on; the C++ reader validates
everything.

Operator kinds (format_version 3, layer attribute ``operator``): "asap" (a
predicted dual and closures; also when the attribute is absent), "sinkhorn"
(the teacher's loop cut to ``sinkhorn_steps`` = T' < T half-steps) and
"teacher" (the exact loop, T half-steps). The last two have no feature
columns. The feature group "score_stats" (three columns: the max, mean and
standard deviation of each query row's scores) needs format_version 5, and
"centered_stats" (two more: the max and the variance of each row's scores less
the keys' column means; only after score_stats) format_version 6.
"""
import json
import os

import numpy as np

FORMAT = "asapc-artifact"
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
OPERATOR_KINDS = ("asap", "sinkhorn", "teacher")
FEATURE_GROUPS = ("sliced_potential", "alpha", "softmax_dual", "sinkhorn_dual3", "score_stats",
                  "centered_stats")
# the first format_version that may hold a feature group (the others: any)
FEATURE_GROUP_SINCE = {"sinkhorn_dual3": 2, "score_stats": 5, "centered_stats": 6}


class ArtifactError(ValueError):
    """An artifact that cannot be used; the message names the file and field."""


def _s(v):
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, np.ndarray) and v.shape == ():
        return _s(v[()])
    return str(v)


class LayerParams:
    """One compiled layer: conventions, feature family and coefficients.

    Attributes: name, operator ('asap' | 'sinkhorn' | 'teacher'),
    sinkhorn_steps (T' for 'sinkhorn', else 0), heads, head_dim, value_dim,
    d_model, score_scale, eps,
    T, mask ('keep_queries' | 'drop_queries'), multiply_by_n, slices, alpha,
    softmax_dual, sinkhorn_dual3, score_stats (the feature family), per_head,
    default_closures, theta (float64 numpy [head_dim, S]), coef (float64
    numpy [heads or 1, P]), weights (dict of numpy arrays wq, bq, ... or
    None), fit (dict).
    """

    score_stats = False     # row max, mean and standard deviation of the scores: 3 columns
    centered_stats = False  # row max and variance of the scores less the column means: 2 more

    def __init__(self, **kw):
        self.__dict__.update(kw)

    @property
    def drop_queries(self):
        return self.mask == "drop_queries"

    @property
    def family_name(self):
        parts = ["L%d" % self.slices] if self.slices else []
        parts += [n for n, on in (("alpha", self.alpha), ("softmax", self.softmax_dual),
                                  ("sinkhorn3", self.sinkhorn_dual3),
                                  ("cstats" if self.centered_stats else "stats", self.score_stats)) if on]
        return "+".join(parts) or "empty"

    @property
    def num_columns(self):
        return (self.slices + int(self.alpha) + int(self.softmax_dual) + int(self.sinkhorn_dual3)
                + 3 * int(self.score_stats) + 2 * int(self.centered_stats))

    @property
    def feature_passes(self):
        return 3 if self.sinkhorn_dual3 else 1 if self.softmax_dual else 0

    @property
    def is_asap(self):
        return self.operator == "asap"

    @property
    def loop_steps(self):
        """Half-steps of the teacher's loop a 'sinkhorn' (T') or 'teacher' (T)
        layer runs; None for an ASAP map."""
        return {"sinkhorn": self.sinkhorn_steps, "teacher": self.T}.get(self.operator)

    @property
    def lse_passes(self):
        """Log-sum-exp half-steps per call: T', T, or the features' passes
        plus the default closures (CompiledLayer::lse_passes)."""
        return self.loop_steps or self.feature_passes + self.default_closures

    @property
    def describe(self):
        """As CompiledLayer::describe(): 'asap L16+alpha+softmax/head k=1',
        "sinkhorn T'=4", 'teacher T=6'."""
        if self.operator == "sinkhorn":
            return "sinkhorn T'=%d" % self.sinkhorn_steps
        if self.operator == "teacher":
            return "teacher T=%d" % self.T
        return "asap %s%s k=%d" % (self.family_name, "/head" if self.per_head else "/pooled",
                                   self.default_closures)

    def __repr__(self):
        return "LayerParams(%r, heads=%d, head_dim=%d, T=%d, %s)" % (
            self.name, self.heads, self.head_dim, self.T, self.describe)


def _string_list(v):
    """An attribute holding a list of strings; h5py gives an empty array (or
    h5py.Empty for a null dataspace) for an empty list."""
    if v is None or type(v).__name__ == "Empty":
        return []
    return [_s(x) for x in np.atleast_1d(v)]


def read_artifact(path):
    """(root attributes dict, [LayerParams] in file order)."""
    import h5py
    if not os.path.isfile(path):
        raise ArtifactError("artifact '%s' does not exist" % path)
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ArtifactError("artifact '%s' is not a readable HDF5 file (%s)" % (path, e))
    with f:
        fmt = _s(f.attrs.get("format", ""))
        if fmt != FORMAT:
            raise ArtifactError("'%s' is not an asapc artifact (format attribute %r)" % (path, fmt))
        version = int(f.attrs.get("format_version", 0))
        if version not in READABLE_VERSIONS:
            raise ArtifactError("artifact '%s' has format_version %d but asap_torch reads versions "
                                "%d to %d" % (path, version, READABLE_VERSIONS[0],
                                              READABLE_VERSIONS[-1]))
        root = {k: (_s(v) if isinstance(v, (bytes, str)) else v.item() if hasattr(v, "item") else v)
                for k, v in f.attrs.items()}
        if "layers" not in f:
            raise ArtifactError("artifact '%s' has no /layers group" % path)
        layers = []
        for key in sorted(f["layers"], key=int):
            g = f["layers"][key]
            where = "artifact '%s' layer group %s" % (path, key)
            a = g.attrs
            try:
                feats = _string_list(a["features"])
                unknown = [x for x in feats if x not in FEATURE_GROUPS]
                if unknown:
                    raise ArtifactError("%s: unknown feature group(s) %s" % (where, unknown))
                for x in feats:
                    if version < FEATURE_GROUP_SINCE.get(x, 1):
                        raise ArtifactError("%s: feature group '%s' needs format_version %d, but the "
                                            "file says %d" % (where, x, FEATURE_GROUP_SINCE[x], version))
                if "centered_stats" in feats and "score_stats" not in feats:
                    raise ArtifactError("%s: feature group 'centered_stats' needs 'score_stats' before it, "
                                        "which attribute 'features' omits" % where)
                slices = int(a["slices"])
                op = _s(a["operator"]) if "operator" in a else "asap"
                if op not in OPERATOR_KINDS:
                    raise ArtifactError("%s: attribute 'operator' is %r, expected 'asap', "
                                        "'sinkhorn' or 'teacher'" % (where, op))
                if op != "asap" and version < 3:
                    raise ArtifactError("%s: operator '%s' needs format_version 3, but the file "
                                        "says %d" % (where, op, version))
                steps = 0
                if op == "sinkhorn":
                    if "sinkhorn_steps" not in a:
                        raise ArtifactError("%s: a 'sinkhorn' operator needs the attribute "
                                            "'sinkhorn_steps' (T'), which is missing" % where)
                    steps = int(a["sinkhorn_steps"])
                theta = np.asarray(g["theta"][()], dtype=np.float64)
                coef = np.asarray(g["coef"][()], dtype=np.float64)
                fit = {}
                if "fit_json" in g:
                    try:
                        fit = json.loads(_s(g["fit_json"][()]))
                    except ValueError:
                        fit = {"raw": _s(g["fit_json"][()])}
                weights = None
                if "weights" in g:
                    weights = {k: np.asarray(g["weights"][k][()]) for k in g["weights"]}
                p = LayerParams(
                    name=_s(a["name"]), operator=op, sinkhorn_steps=steps, layout=_s(a["layout"]),
                    heads=int(a["heads"]), head_dim=int(a["head_dim"]), value_dim=int(a["value_dim"]),
                    d_model=int(a["d_model"]), score_scale=float(a["score_scale"]),
                    eps=float(a["eps"]), T=int(a["T"]), mask=_s(a["mask"]),
                    multiply_by_n=bool(int(a["multiply_by_n"])), head_layout=_s(a["head_layout"]),
                    qkv_order=_s(a.get("qkv_order", "qkv")) or "qkv", artifact_path=path,
                    slices=slices, alpha="alpha" in feats, softmax_dual="softmax_dual" in feats,
                    sinkhorn_dual3="sinkhorn_dual3" in feats, score_stats="score_stats" in feats,
                    centered_stats="centered_stats" in feats,
                    per_head=bool(int(a["per_head"])),
                    default_closures=int(a["default_closures"]), theta=theta, coef=coef,
                    weights=weights, fit=fit)
            except KeyError as e:
                raise ArtifactError("%s: missing field %s" % (where, e))
            if op == "sinkhorn" and not 1 <= steps < p.T:
                raise ArtifactError("%s ('%s'): attribute 'sinkhorn_steps' (T') must be in "
                                    "1..T-1 = 1..%d, found %d" % (where, p.name, p.T - 1, steps))
            if op == "asap" and p.num_columns == 0:
                raise ArtifactError("%s ('%s'): the feature family has no columns"
                                    % (where, p.name))
            if op != "asap" and p.num_columns != 0:
                raise ArtifactError("%s ('%s'): a '%s' operator has no feature columns, found "
                                    "the family %s" % (where, p.name, op, p.family_name))
            if theta.ndim != 2 or theta.shape[0] != p.head_dim or theta.shape[1] < slices:
                raise ArtifactError("%s ('%s'): theta has shape %s, expected [%d, >= %d]"
                                    % (where, p.name, theta.shape, p.head_dim, slices))
            want = (p.heads if p.per_head else 1, p.num_columns)
            if coef.shape != want:
                raise ArtifactError("%s ('%s'): coef has shape %s, expected %s"
                                    % (where, p.name, coef.shape, want))
            layers.append(p)
        names = [p.name for p in layers]
        if len(set(names)) != len(names):
            raise ArtifactError("artifact '%s' names a layer twice" % path)
        return root, layers
