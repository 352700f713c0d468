// io/artifact.cpp -- the compiled artifact in HDF5 (docs/artifact-format.md).
//
// One validation routine (check_layer) serves both directions: the writer
// runs it on each layer before writing it, so it never produces a file the
// reader would refuse, and the reader runs it on what it loaded, before
// anything uses it.
#include "asap/artifact.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <optional>
#include <set>

#include "asap/error.h"
#include "io/h5util.h"

#ifndef ASAP_VERSION_STRING
#define ASAP_VERSION_STRING "unknown"
#endif

namespace asap {

namespace h5 = detail::h5;

// ---- Artifact ----------------------------------------------------------------

const CompiledLayer* Artifact::find(const std::string& name) const {
  for (const auto& l : layers)
    if (l.spec.name == name) return &l;
  return nullptr;
}

namespace {

// Column groups, in column order.
constexpr const char* kFeatSliced = "sliced_potential";
constexpr const char* kFeatAlpha = "alpha";
constexpr const char* kFeatSoftmax = "softmax_dual";
constexpr const char* kFeatSinkhorn3 = "sinkhorn_dual3";      // format version 2
constexpr const char* kFeatScoreStats = "score_stats";        // format version 5
constexpr const char* kFeatCenteredStats = "centered_stats";  // format version 6
// Largest slice count a layer may declare: keeps slices + 3 columns and the
// shape arithmetic far from int64 overflow (any real bank is far smaller).
constexpr int64_t kMaxSlices = int64_t{1} << 31;

std::string file_desc(const std::string& path) { return asap::str("artifact '", path, "'"); }

// "artifact 'a.h5': layer 'blocks.0.attn' (/layers/0000)"
std::string at_layer(const h5::Where& w, const std::string& name) {
  return asap::str(w.file, ": layer '", name, "' (", w.obj, ")");
}

std::string layer_group_name(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04zu", i);
  return buf;
}

const char* layout_name(ProjLayout l) {
  switch (l) {
    case ProjLayout::kFused:
      return "fused";
    case ProjLayout::kSeparate:
      return "separate";
    case ProjLayout::kNone:
      return "none";
  }
  return "?";
}

const char* mask_name(MaskConvention m) { return m == MaskConvention::kKeepQueries ? "keep_queries" : "drop_queries"; }

std::string utc_now() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<std::string> feature_list(const FeatureFamily& f) {
  std::vector<std::string> v;
  if (f.slices > 0) v.push_back(kFeatSliced);
  if (f.alpha) v.push_back(kFeatAlpha);
  if (f.softmax_dual) v.push_back(kFeatSoftmax);
  if (f.sinkhorn_dual3) v.push_back(kFeatSinkhorn3);
  if (f.score_stats) v.push_back(kFeatScoreStats);
  if (f.centered_stats) v.push_back(kFeatCenteredStats);
  return v;
}

bool all_finite(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  const double* p = c.data_ptr<double>();
  for (int64_t i = 0, n = c.numel(); i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}

// ---- shared validation -------------------------------------------------------

// Shapes of a layer's tensors: taken from the tensors (writer, and after a
// read), or from the file's metadata before anything is read, so a hostile
// file is refused before a single byte is allocated for it (a damaged
// file must not make the reader allocate what its metadata claims).
using Shape = std::optional<std::vector<int64_t>>;  // nullopt = absent
struct LayerShapes {
  Shape theta, coef, wq, bq, wk, bk, wv, bv, wo, bo;
};

Shape shape_of(const at::Tensor& t) {
  if (!t.defined()) return std::nullopt;
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

LayerShapes shapes_of(const CompiledLayer& L) {
  const LayerWeights& W = L.weights;
  return {shape_of(L.theta), shape_of(L.coef), shape_of(W.wq), shape_of(W.bq), shape_of(W.wk),
          shape_of(W.bk),    shape_of(W.wv),   shape_of(W.bv), shape_of(W.wo), shape_of(W.bo)};
}

void check_weight_shape(const Shape& got, const char* field, const std::vector<int64_t>& expected,
                        const std::string& where) {
  if (!got) return;
  ASAP_CHECK(*got == expected, where, ": weights/", field, " has shape ", h5::shape_str(*got), ", expected ",
             h5::shape_str(expected));
}

void check_weight_values(const at::Tensor& t, const char* field, const std::string& where) {
  if (!t.defined()) return;
  ASAP_CHECK(at::isFloatingType(t.scalar_type()), where, ": weights/", field, " should be floating point, found ",
             t.scalar_type());
  ASAP_CHECK(all_finite(t), where, ": weights/", field, " contains NaN/Inf");
}

// Everything about a layer but the tensors' values; `w.obj` is the layer's group path.
void check_layer_shapes(const CompiledLayer& L, const LayerShapes& sh, const h5::Where& w) {
  const LayerSpec& s = L.spec;
  const std::string where = at_layer(w, s.name);
  ASAP_CHECK(!s.name.empty(), w.file, ": layer at ", w.obj, " has an empty name");
  ASAP_CHECK(s.heads >= 1, where, ": heads must be >= 1, found ", s.heads);
  ASAP_CHECK(s.head_dim >= 1, where, ": head_dim must be >= 1, found ", s.head_dim);
  ASAP_CHECK(s.value_dim >= 0, where, ": value_dim must be >= 0, found ", s.value_dim);
  ASAP_CHECK(s.d_model >= 0, where, ": d_model must be >= 0, found ", s.d_model);
  ASAP_CHECK(std::isfinite(s.score_scale) && s.score_scale > 0, where,
             ": score_scale must be a finite number > 0, found ", s.score_scale);
  ASAP_CHECK(std::isfinite(s.eps) && s.eps > 0, where, ": eps must be a finite number > 0, found ", s.eps);
  ASAP_CHECK(s.T >= 2, where, ": T (Sinkhorn budget) must be >= 2, found ", s.T);
  std::string order = s.qkv_order;
  std::sort(order.begin(), order.end());
  ASAP_CHECK(order == "kqv", where, ": qkv_order must be a permutation of \"qkv\", found \"", s.qkv_order, "\"");
  ASAP_CHECK(s.head_layout == "(h d)" || s.head_layout == "(d h)", where,
             ": head_layout must be \"(h d)\" or \"(d h)\", found \"", s.head_layout, "\"");

  const FeatureFamily& fam = L.family;
  ASAP_CHECK(fam.slices >= 0 && fam.slices <= kMaxSlices, where, ": slices must be in 0..", kMaxSlices, ", found ",
             fam.slices);
  if (L.kind == OperatorKind::kAsap) {
    ASAP_CHECK(fam.num_columns() >= 1, where, ": the feature family has no columns");
    ASAP_CHECK(L.sinkhorn_steps == 0, where, ": sinkhorn_steps must be 0 for an ASAP operator, found ",
               L.sinkhorn_steps);
  } else {
    ASAP_CHECK(fam.num_columns() == 0, where, ": a '", operator_kind_name(L.kind),
               "' operator has no feature columns, found the family ", fam.name());
    if (L.kind == OperatorKind::kSinkhorn)
      ASAP_CHECK(L.sinkhorn_steps >= 1 && L.sinkhorn_steps < s.T, where,
                 ": sinkhorn_steps (T') must be in 1..T-1 = 1..", s.T - 1, ", found ", L.sinkhorn_steps);
    else
      ASAP_CHECK(L.sinkhorn_steps == 0, where, ": sinkhorn_steps must be 0 for the teacher operator, found ",
                 L.sinkhorn_steps);
  }
  ASAP_CHECK(L.default_closures >= 1, where, ": default_closures must be >= 1, found ", L.default_closures);

  ASAP_CHECK(sh.theta.has_value(), where, ": theta is undefined");
  const std::vector<int64_t>& theta = *sh.theta;
  ASAP_CHECK(theta.size() == 2 && theta[0] == s.head_dim, where, ": theta has shape ", h5::shape_str(theta),
             " but should be [head_dim, slices] with head_dim = ", s.head_dim);
  ASAP_CHECK(theta[1] >= fam.slices, where, ": theta has ", theta[1], " columns but the feature family ", fam.name(),
             " uses ", fam.slices, " slices");

  const int64_t G = L.per_head ? s.heads : 1;
  ASAP_CHECK(sh.coef.has_value(), where, ": coef is undefined");
  const std::vector<int64_t>& coef = *sh.coef;
  ASAP_CHECK(coef.size() == 2 && coef[0] == G && coef[1] == fam.num_columns(), where, ": coef has shape ",
             h5::shape_str(coef), " but per_head = ", L.per_head ? "true" : "false", " and the feature family ",
             fam.name(), " has ", fam.num_columns(), fam.num_columns() == 1 ? " column" : " columns", ", so expected [",
             G, ", ", fam.num_columns(), "]");

  if (!sh.wq) {
    ASAP_CHECK(!sh.bq && !sh.wk && !sh.bk && !sh.wv && !sh.bv && !sh.wo && !sh.bo, where,
               ": weights are given without weights/wq");
  } else {
    ASAP_CHECK(sh.wk && sh.wv, where, ": weights/wq is given but weights/", sh.wk ? "wv" : "wk", " is missing");
    ASAP_CHECK(s.d_model >= 1 && s.value_dim >= 1, where,
               ": a layer with projection weights needs d_model >= 1 and value_dim >= 1, found ", s.d_model, " and ",
               s.value_dim);
    int64_t hq = 0, hv = 0;
    ASAP_CHECK(h5::mul_ok(s.heads, s.head_dim, &hq) && h5::mul_ok(s.heads, s.value_dim, &hv), where,
               ": heads * head_dim or heads * value_dim overflows 64-bit sizes (heads = ", s.heads,
               ", head_dim = ", s.head_dim, ", value_dim = ", s.value_dim, ")");
    check_weight_shape(sh.wq, "wq", {hq, s.d_model}, where);
    check_weight_shape(sh.bq, "bq", {hq}, where);
    check_weight_shape(sh.wk, "wk", {hq, s.d_model}, where);
    check_weight_shape(sh.bk, "bk", {hq}, where);
    check_weight_shape(sh.wv, "wv", {hv, s.d_model}, where);
    check_weight_shape(sh.bv, "bv", {hv}, where);
    if (sh.wo) {
      ASAP_CHECK(sh.wo->size() == 2, where, ": weights/wo should be [d_out, heads*value_dim], found ",
                 h5::shape_str(*sh.wo));
      check_weight_shape(sh.wo, "wo", {(*sh.wo)[0], hv}, where);
      check_weight_shape(sh.bo, "bo", {(*sh.wo)[0]}, where);
    } else {
      ASAP_CHECK(!sh.bo, where, ": weights/bo is given without weights/wo");
    }
  }
}

// Everything a consumer relies on; `w.obj` is the layer's group path.
void check_layer(const CompiledLayer& L, const h5::Where& w) {
  check_layer_shapes(L, shapes_of(L), w);
  const std::string where = at_layer(w, L.spec.name);
  ASAP_CHECK(all_finite(L.theta), where, ": theta contains NaN/Inf");
  {
    // Slice directions are unit vectors; allow float32 round-off.
    at::Tensor th = L.theta.to(at::kDouble).contiguous();
    const double* p = th.data_ptr<double>();
    const int64_t rows = th.size(0), cols = th.size(1);
    for (int64_t j = 0; j < cols; ++j) {
      double nn = 0;
      for (int64_t i = 0; i < rows; ++i) nn += p[i * cols + j] * p[i * cols + j];
      ASAP_CHECK(std::abs(std::sqrt(nn) - 1.0) <= 1e-5, where, ": theta column ", j, " has norm ", std::sqrt(nn),
                 "; slice directions must be unit vectors");
    }
  }
  ASAP_CHECK(all_finite(L.coef), where, ": coef contains NaN/Inf");
  const LayerWeights& W = L.weights;
  check_weight_values(W.wq, "wq", where);
  check_weight_values(W.bq, "bq", where);
  check_weight_values(W.wk, "wk", where);
  check_weight_values(W.bk, "bk", where);
  check_weight_values(W.wv, "wv", where);
  check_weight_values(W.bv, "bv", where);
  check_weight_values(W.wo, "wo", where);
  check_weight_values(W.bo, "bo", where);
}

// ---- writer ----------------------------------------------------------------------

at::Tensor storable_weight(const at::Tensor& t) {
  // float32/float64 keep their dtype; half/bfloat16 widen to float32 losslessly.
  if (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) return t;
  return t.to(at::kFloat);
}

void write_layer(const H5::Group& g, const CompiledLayer& L, const h5::Where& w) {
  const LayerSpec& s = L.spec;
  auto S = [&](const char* k, const std::string& v) { h5::write_string_attr(g, k, v, w); };
  auto I = [&](const char* k, int64_t v) { h5::write_int_attr(g, k, v, w); };
  auto D = [&](const char* k, double v) { h5::write_double_attr(g, k, v, w); };
  S("name", s.name);
  S("layout", layout_name(s.layout));
  S("qkv_weight", s.qkv.weight);
  S("qkv_bias", s.qkv.bias);
  S("qkv_order", s.qkv_order);
  S("q_weight", s.q.weight);
  S("q_bias", s.q.bias);
  S("k_weight", s.k.weight);
  S("k_bias", s.k.bias);
  S("v_weight", s.v.weight);
  S("v_bias", s.v.bias);
  S("out_weight", s.out.weight);
  S("out_bias", s.out.bias);
  S("head_layout", s.head_layout);
  I("d_model", s.d_model);
  I("heads", s.heads);
  I("head_dim", s.head_dim);
  I("value_dim", s.value_dim);
  D("score_scale", s.score_scale);
  D("eps", s.eps);
  I("T", s.T);
  S("mask", mask_name(s.mask));
  I("multiply_by_n", s.multiply_by_n ? 1 : 0);
  S("ending", s.T % 2 == 0 ? "column" : "row");
  if (L.kind != OperatorKind::kAsap) {  // format version 3; ASAP layers omit it (the default)
    S("operator", operator_kind_name(L.kind));
    if (L.kind == OperatorKind::kSinkhorn) I("sinkhorn_steps", L.sinkhorn_steps);
  }
  h5::write_string_list_attr(g, "features", feature_list(L.family), w);
  I("slices", L.family.slices);
  I("per_head", L.per_head ? 1 : 0);
  I("default_closures", L.default_closures);

  h5::write_tensor(g, "theta", L.theta.to(at::kDouble), 0, w);
  h5::write_tensor(g, "coef", L.coef.to(at::kDouble), 0, w);
  h5::write_string_dataset(g, "fit_json", L.fit_json, w);

  const LayerWeights& W = L.weights;
  if (W.defined()) {
    H5::Group wg = h5::create_group(g, "weights", w);
    h5::Where ww = w.child("weights");
    const std::pair<const char*, const at::Tensor*> fields[] = {{"wq", &W.wq}, {"bq", &W.bq}, {"wk", &W.wk},
                                                                {"bk", &W.bk}, {"wv", &W.wv}, {"bv", &W.bv},
                                                                {"wo", &W.wo}, {"bo", &W.bo}};
    for (const auto& [name, t] : fields)
      if (t->defined()) h5::write_tensor(wg, name, storable_weight(*t), 0, ww);
  }
}

// ---- reader ----------------------------------------------------------------------

// Opens a float dataset and returns its metadata (shape, type), refusing
// other types and extents not backed by stored data; nothing is read.
h5::DatasetInfo float_dataset_info(const H5::Group& g, const char* field, const h5::Where& w,
                                   const std::string& where) {
  ASAP_CHECK(h5::has_link(g, field), where, ": required dataset '", field, "' is missing");
  H5::DataSet ds = h5::open_dataset(g, field, w);
  h5::DatasetInfo di = h5::dataset_info(ds, w.child(field));
  ASAP_CHECK(di.cls == H5T_FLOAT && (di.size == 4 || di.size == 8), where, ": dataset '", field,
             "' should be float32 or float64, found ", di.type_name());
  return di;
}

// Reads a float dataset whose metadata float_dataset_info() accepted.
at::Tensor read_float_dataset(const H5::Group& g, const char* field, const h5::DatasetInfo& di, const h5::Where& w,
                              bool keep_dtype) {
  H5::DataSet ds = h5::open_dataset(g, field, w);
  at::ScalarType dt = keep_dtype && di.size == 4 ? at::kFloat : at::kDouble;
  return h5::read_all(ds, dt, w.child(field));
}

CompiledLayer read_layer(const H5::Group& g, const h5::Where& w, int64_t format_version) {
  CompiledLayer L;
  LayerSpec& s = L.spec;
  s.name = h5::read_string_attr(g, "name", w);
  const std::string where = at_layer(w, s.name);
  h5::Where lw{w.file, asap::str(w.obj, " (layer '", s.name, "')")};  // names the layer in helper messages
  auto S = [&](const char* k) { return h5::read_string_attr(g, k, lw); };
  auto I = [&](const char* k) { return h5::read_int_attr(g, k, lw); };
  auto D = [&](const char* k) { return h5::read_double_attr(g, k, lw); };

  std::string layout = S("layout");
  if (layout == "fused")
    s.layout = ProjLayout::kFused;
  else if (layout == "separate")
    s.layout = ProjLayout::kSeparate;
  else if (layout == "none")
    s.layout = ProjLayout::kNone;
  else
    throw Error(asap::str(where, ": attribute 'layout' is '", layout, "', expected 'fused', 'separate' or 'none'"));
  s.qkv.weight = S("qkv_weight");
  s.qkv.bias = S("qkv_bias");
  s.qkv_order = S("qkv_order");
  s.q.weight = S("q_weight");
  s.q.bias = S("q_bias");
  s.k.weight = S("k_weight");
  s.k.bias = S("k_bias");
  s.v.weight = S("v_weight");
  s.v.bias = S("v_bias");
  s.out.weight = S("out_weight");
  s.out.bias = S("out_bias");
  s.head_layout = S("head_layout");
  s.d_model = I("d_model");
  s.heads = I("heads");
  s.head_dim = I("head_dim");
  s.value_dim = I("value_dim");
  s.score_scale = D("score_scale");
  s.eps = D("eps");
  int64_t T = I("T");
  ASAP_CHECK(T >= 2 && T <= 1000000000, where, ": attribute 'T' (Sinkhorn budget) must be >= 2, found ", T);
  s.T = static_cast<int>(T);
  std::string mask = S("mask");
  if (mask == "keep_queries")
    s.mask = MaskConvention::kKeepQueries;
  else if (mask == "drop_queries")
    s.mask = MaskConvention::kDropQueries;
  else
    throw Error(asap::str(where, ": attribute 'mask' is '", mask, "', expected 'keep_queries' or 'drop_queries'"));
  int64_t mbn = I("multiply_by_n");
  ASAP_CHECK(mbn == 0 || mbn == 1, where, ": attribute 'multiply_by_n' must be 0 or 1, found ", mbn);
  s.multiply_by_n = mbn == 1;
  if (h5::has_attr(g, "ending")) {
    // Derived from T; a mismatch means the file was edited inconsistently.
    std::string ending = S("ending"), expect = s.T % 2 == 0 ? "column" : "row";
    ASAP_CHECK(ending == expect, where, ": attribute 'ending' is '", ending, "' but T = ", s.T, " implies '", expect,
               "'");
  }

  if (h5::has_attr(g, "operator")) {
    const std::string op = S("operator");
    if (op == "asap")
      L.kind = OperatorKind::kAsap;
    else if (op == "sinkhorn")
      L.kind = OperatorKind::kSinkhorn;
    else if (op == "teacher")
      L.kind = OperatorKind::kTeacher;
    else
      throw Error(asap::str(where, ": attribute 'operator' is '", op, "', expected 'asap', 'sinkhorn' or 'teacher'"));
    ASAP_CHECK(L.kind == OperatorKind::kAsap || format_version >= 3, where, ": operator '", op,
               "' needs format_version 3, but the file says ", format_version);
    if (L.kind == OperatorKind::kSinkhorn) {
      ASAP_CHECK(h5::has_attr(g, "sinkhorn_steps"), where,
                 ": a 'sinkhorn' operator needs the attribute 'sinkhorn_steps' (T'), which is missing");
      const int64_t tp = I("sinkhorn_steps");
      ASAP_CHECK(tp >= 1 && tp < s.T, where, ": attribute 'sinkhorn_steps' (T') must be in 1..T-1 = 1..", s.T - 1,
                 ", found ", tp);
      L.sinkhorn_steps = static_cast<int>(tp);
    }
  }
  std::vector<std::string> feats = h5::read_string_list_attr(g, "features", lw);
  std::set<std::string> seen;
  for (const auto& f : feats) {
    ASAP_CHECK(f == kFeatSliced || f == kFeatAlpha || f == kFeatSoftmax || f == kFeatSinkhorn3 ||
                   f == kFeatScoreStats || f == kFeatCenteredStats,
               where, ": attribute 'features' names unknown feature group '", f, "' (known: ", kFeatSliced, ", ",
               kFeatAlpha, ", ", kFeatSoftmax, ", ", kFeatSinkhorn3, ", ", kFeatScoreStats, ", ", kFeatCenteredStats,
               ")");
    ASAP_CHECK(seen.insert(f).second, where, ": attribute 'features' lists '", f, "' twice");
  }
  L.family.slices = I("slices");
  ASAP_CHECK(L.family.slices >= 0 && L.family.slices <= kMaxSlices, where, ": attribute 'slices' must be in 0..",
             kMaxSlices, ", found ", L.family.slices);
  L.family.alpha = seen.count(kFeatAlpha) != 0;
  L.family.softmax_dual = seen.count(kFeatSoftmax) != 0;
  L.family.sinkhorn_dual3 = seen.count(kFeatSinkhorn3) != 0;
  ASAP_CHECK(!L.family.sinkhorn_dual3 || format_version >= 2, where, ": feature group '", kFeatSinkhorn3,
             "' needs format_version 2, but the file says ", format_version);
  L.family.score_stats = seen.count(kFeatScoreStats) != 0;
  ASAP_CHECK(!L.family.score_stats || format_version >= kArtifactScoreStatsSince, where, ": feature group '",
             kFeatScoreStats, "' needs format_version ", kArtifactScoreStatsSince, ", but the file says ",
             format_version);
  L.family.centered_stats = seen.count(kFeatCenteredStats) != 0;
  ASAP_CHECK(!L.family.centered_stats || format_version >= kArtifactCenteredStatsSince, where, ": feature group '",
             kFeatCenteredStats, "' needs format_version ", kArtifactCenteredStatsSince, ", but the file says ",
             format_version);
  ASAP_CHECK(!L.family.centered_stats || L.family.score_stats, where, ": feature group '", kFeatCenteredStats,
             "' needs '", kFeatScoreStats, "' before it, which attribute 'features' omits");
  if (seen.count(kFeatSliced))
    ASAP_CHECK(L.family.slices >= 1, where, ": attribute 'features' includes '", kFeatSliced,
               "' but attribute 'slices' is ", L.family.slices, " (expected >= 1)");
  else
    ASAP_CHECK(L.family.slices == 0, where, ": attribute 'slices' is ", L.family.slices,
               " but attribute 'features' omits '", kFeatSliced, "'");
  int64_t per_head = I("per_head");
  ASAP_CHECK(per_head == 0 || per_head == 1, where, ": attribute 'per_head' must be 0 or 1, found ", per_head);
  L.per_head = per_head == 1;
  int64_t closures = I("default_closures");
  ASAP_CHECK(closures >= 1 && closures <= 1000000000, where, ": attribute 'default_closures' must be >= 1, found ",
             closures);
  L.default_closures = static_cast<int>(closures);

  // Every dataset's type, shape and stored extent is checked against the
  // layer's attributes from metadata alone, before any data is read.
  LayerShapes sh;
  // Datasets are named by their path alone ("/layers/0000/theta").
  const h5::DatasetInfo theta_info = float_dataset_info(g, "theta", w, where);
  const h5::DatasetInfo coef_info = float_dataset_info(g, "coef", w, where);
  sh.theta = theta_info.shape;
  sh.coef = coef_info.shape;
  std::optional<H5::Group> wg;
  h5::Where ww = w.child("weights");
  LayerWeights& W = L.weights;
  const std::pair<const char*, at::Tensor*> wfields[] = {{"wq", &W.wq}, {"bq", &W.bq}, {"wk", &W.wk}, {"bk", &W.bk},
                                                         {"wv", &W.wv}, {"bv", &W.bv}, {"wo", &W.wo}, {"bo", &W.bo}};
  Shape* wshapes[] = {&sh.wq, &sh.bq, &sh.wk, &sh.bk, &sh.wv, &sh.bv, &sh.wo, &sh.bo};
  std::vector<std::optional<h5::DatasetInfo>> winfo(8);
  if (h5::has_link(g, "weights")) {
    ASAP_CHECK(h5::is_group(g, "weights"), where, ": 'weights' should be a group");
    wg = h5::guarded(lw, "opening group 'weights'", [&] { return g.openGroup("weights"); });
    for (size_t i = 0; i < 8; ++i) {
      if (!h5::has_link(*wg, wfields[i].first)) continue;
      winfo[i] = float_dataset_info(*wg, wfields[i].first, ww, where + ": weights");
      *wshapes[i] = winfo[i]->shape;
    }
  }
  check_layer_shapes(L, sh, w);

  L.theta = read_float_dataset(g, "theta", theta_info, w, false);
  L.coef = read_float_dataset(g, "coef", coef_info, w, false);
  for (size_t i = 0; i < 8; ++i)
    if (winfo[i]) *wfields[i].second = read_float_dataset(*wg, wfields[i].first, *winfo[i], ww, true);

  if (h5::has_link(g, "fit_json")) {
    L.fit_json = h5::read_string_dataset(g, "fit_json", w);
  } else if (h5::has_attr(g, "fit_json")) {
    L.fit_json = S("fit_json");
  }
  check_layer(L, w);
  return L;
}

}  // namespace

void write_artifact(const std::string& path, const Artifact& art) {
  const std::string fd = file_desc(path);
  ASAP_CHECK(!art.layers.empty(), fd, ": cannot write an artifact with no layers");
  std::set<std::string> names;
  for (const auto& l : art.layers)
    ASAP_CHECK(names.insert(l.spec.name).second, fd, ": layer '", l.spec.name, "' appears twice");

  h5::Where root{fd, "/"};
  h5::write_atomically(path, root, [&](H5::H5File& f) {
    h5::write_string_attr(f, "format", kArtifactFormat, root);
    // Fixed-length strings (version 4) cannot be expressed by an older
    // version; version 5 only when a layer has the score_stats columns, 6
    // when one has the centered_stats ones.
    bool stats = false, cstats = false;
    for (const auto& l : art.layers) {
      stats |= l.kind == OperatorKind::kAsap && l.family.score_stats;
      cstats |= l.kind == OperatorKind::kAsap && l.family.centered_stats;
    }
    h5::write_int_attr(f, "format_version",
                       cstats  ? kArtifactCenteredStatsSince
                       : stats ? kArtifactScoreStatsSince
                               : kArtifactFixedStringsSince,
                       root);
    h5::write_string_attr(f, "asapc_version", art.asapc_version.empty() ? ASAP_VERSION_STRING : art.asapc_version,
                          root);
    h5::write_string_attr(f, "teacher_sha256", art.teacher_sha256, root);
    h5::write_string_attr(f, "teacher_file", art.teacher_file, root);
    h5::write_string_attr(f, "created_utc", art.created_utc.empty() ? utc_now() : art.created_utc, root);
    h5::write_int_attr(f, "num_layers", static_cast<int64_t>(art.layers.size()), root);
    H5::Group lg = h5::create_group(f, "layers", root);
    h5::Where lw{fd, "/layers"};
    for (size_t i = 0; i < art.layers.size(); ++i) {
      const std::string gname = layer_group_name(i);
      h5::Where gw = lw.child(gname);
      check_layer(art.layers[i], gw);
      H5::Group g = h5::create_group(lg, gname, lw);
      write_layer(g, art.layers[i], gw);
    }
  });
}

Artifact read_artifact(const std::string& path) {
  const std::string fd = file_desc(path);
  h5::Where root{fd, "/"};
  H5::H5File f = h5::open_file(path, root);

  ASAP_CHECK(h5::has_attr(f, "format"), fd, " is not an asapc artifact: root attribute 'format' is missing (expected '",
             kArtifactFormat, "')");
  h5::refuse_vlen_root(f, root, "format_version", kArtifactFixedStringsSince, path, "compile it again");
  std::string format = h5::read_string_attr(f, "format", root);
  ASAP_CHECK(format == kArtifactFormat, fd, " is not an asapc artifact: root attribute 'format' is '", format,
             "', expected '", kArtifactFormat, "'");
  ASAP_CHECK(h5::has_attr(f, "format_version"), fd, ": root attribute 'format_version' is missing");
  int64_t version = h5::read_int_attr(f, "format_version", root);
  ASAP_CHECK(version >= 1, fd, " has format_version ", version, ", which is not a valid version (versions start at 1)");
  ASAP_CHECK(version <= kArtifactVersion && version >= kArtifactOldestReadable, fd, " has format_version ", version,
             " but this asapc reads versions ", kArtifactOldestReadable, " to ", kArtifactVersion);

  Artifact art;
  art.format_version = static_cast<int>(version);
  art.asapc_version = h5::read_string_attr(f, "asapc_version", root);
  art.teacher_sha256 = h5::read_string_attr(f, "teacher_sha256", root);
  art.teacher_file = h5::read_string_attr(f, "teacher_file", root);
  art.created_utc = h5::read_string_attr(f, "created_utc", root);
  int64_t num_layers = h5::read_int_attr(f, "num_layers", root);
  ASAP_CHECK(num_layers >= 1, fd, ": root attribute 'num_layers' must be >= 1, found ", num_layers);

  ASAP_CHECK(h5::is_group(f, "layers"), fd, ": group '/layers' is missing");
  H5::Group lg = h5::guarded(root, "opening '/layers'", [&] { return f.openGroup("layers"); });
  h5::Where lw{fd, "/layers"};
  // Group names are decimal layer indices (zero padding optional).
  std::map<int64_t, std::string> by_index;
  for (const std::string& child : h5::list_children(lg, false, lw)) {
    bool digits = !child.empty() && child.size() <= 9 && child.find_first_not_of("0123456789") == std::string::npos;
    ASAP_CHECK(digits && h5::is_group(lg, child), fd, ": '/layers/", child,
               "' is not a layer group (expected groups named by layer index 0..", num_layers - 1, ")");
    int64_t idx = std::stoll(child);
    ASAP_CHECK(idx < num_layers, fd, " has layer group '/layers/", child, "' but num_layers is ", num_layers);
    ASAP_CHECK(by_index.emplace(idx, child).second, fd, ": layer index ", idx, " appears twice under '/layers'");
  }
  for (int64_t i = 0; i < num_layers; ++i)
    ASAP_CHECK(by_index.count(i), fd, ": layer group ", i, " is missing under '/layers' (num_layers = ", num_layers,
               ")");

  std::set<std::string> names;
  for (const auto& entry : by_index) {
    const std::string& gname = entry.second;  // not a structured binding: clang 14 cannot capture those
    h5::Where gw = lw.child(gname);
    H5::Group g = h5::guarded(lw, asap::str("opening group '", gname, "'"), [&] { return lg.openGroup(gname); });
    CompiledLayer L = read_layer(g, gw, version);
    ASAP_CHECK(names.insert(L.spec.name).second, fd, ": layer name '", L.spec.name, "' appears twice");
    art.layers.push_back(std::move(L));
  }
  return art;
}

}  // namespace asap
