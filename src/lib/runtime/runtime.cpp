// The compiled operator for inference code (asap-math.md section 5).
#include "asap/runtime.h"

#include <ATen/ATen.h>

#include <limits>

#include "asap/error.h"
#include "asap/fast.h"
#include "asap/features.h"
#include "asap/operator.h"
#include "runtime/checks.h"

namespace asap {

Convention convention_of(const LayerSpec& s) {
  Convention c;
  c.eps = s.eps;
  c.drop_padded_queries = s.mask == MaskConvention::kDropQueries;
  c.multiply_by_n = s.multiply_by_n;
  return c;
}

namespace detail {

void check_layer_inputs(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const LayerSpec& s = L.spec;
  ASAP_CHECK(q.dim() == 4 && q.size(1) == s.heads && q.size(3) == s.head_dim, "layer '", s.name,
             "': q must be [B, ", s.heads, ", n, ", s.head_dim, "], found ", q.sizes());
  ASAP_CHECK(k.sizes() == q.sizes(), "layer '", s.name, "': k must have q's shape ", q.sizes(), ", found ",
             k.sizes());
  ASAP_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == s.heads && v.size(2) == q.size(2), "layer '",
             s.name, "': v must be [", q.size(0), ", ", s.heads, ", ", q.size(2), ", dv], found ", v.sizes());
}

}  // namespace detail

namespace {

// The zero-parameter kinds: the teacher's loop with T' (sinkhorn) or T
// (teacher) half-steps, through `run` (the fused or the reference teacher).
template <class Run>
LayerOutput run_loop_kind(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& key_mask, const RunOptions& opt, Run run) {
  const LayerSpec& s = L.spec;
  detail::check_layer_inputs(L, q, k, v);
  ASAP_CHECK(opt.closures == 0, "layer '", s.name, "' runs ", L.describe(),
             ", which has no closures to set: pass closures = 0");
  const int steps = L.kind == OperatorKind::kSinkhorn ? L.sinkhorn_steps : s.T;
  auto t = run(q, k, v.to(q.scalar_type()), key_mask, s.score_scale, steps, convention_of(s), opt.return_attention);
  LayerOutput r;
  r.out = t.O;
  r.attention = t.A;
  return r;
}

// Whether every value of a tensor is finite: x * 0 is 0 for finite x and NaN
// otherwise; eight independent sums let the loop vectorise.
template <class T>
bool all_finite_raw(const T* p, int64_t n) {
  T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += p[i + j] * T(0);
  for (; i < n; ++i) acc[0] += p[i] * T(0);
  T s = 0;
  for (T a : acc) s += a;
  return s == T(0);
}

bool all_finite(const at::Tensor& t) {
  if (t.is_contiguous() && t.device().is_cpu()) {
    if (t.scalar_type() == at::kFloat) return all_finite_raw(t.data_ptr<float>(), t.numel());
    if (t.scalar_type() == at::kDouble) return all_finite_raw(t.data_ptr<double>(), t.numel());
  }
  return t.isfinite().all().item<bool>();
}

// NaN in, NaN out (issue 16, item 5; docs/decisions.md): a head whose q, k or
// v holds a NaN or an infinity returns NaN for its whole output, attention
// and predicted dual, as Sinkhorn attention written in PyTorch does (one
// non-finite score spreads through the column normalisations). Checked in
// one pass over the inputs; heads are located only when something is wrong.
void propagate_nonfinite(LayerOutput& r, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (all_finite(q) && all_finite(k) && all_finite(v)) return;
  auto finite = [](const at::Tensor& t) { return t.isfinite().all(-1).all(-1); };  // [B, H]
  auto bad = finite(q).logical_and(finite(k)).logical_and(finite(v)).logical_not();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (r.out.defined()) r.out = r.out.masked_fill(bad.unsqueeze(-1).unsqueeze(-1), nan);
  if (r.attention.defined()) r.attention = r.attention.masked_fill(bad.unsqueeze(-1).unsqueeze(-1), nan);
  if (r.phi_hat.defined()) r.phi_hat = r.phi_hat.masked_fill(bad.unsqueeze(-1), nan);
}

}  // namespace

LayerOutput run_layer_reference(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& key_mask, const RunOptions& opt) {
  const LayerSpec& s = L.spec;
  if (L.kind != OperatorKind::kAsap) return run_loop_kind(L, q, k, v, key_mask, opt, run_teacher_reference);
  detail::check_layer_inputs(L, q, k, v);
  ASAP_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, "layer '", s.name,
             "': q, k, v must be float32 or float64, found ", q.scalar_type());
  const int closures = opt.closures > 0 ? opt.closures : L.default_closures;
  const Convention c = convention_of(s);
  const int64_t B = q.size(0), n = q.size(2);
  auto m = log_marginals(key_mask, B, n, c.drop_padded_queries, q.scalar_type(), q.device());
  auto S = scores(q, k, s.score_scale);
  auto Psi = build_features(q, k, m, L.theta, L.family, s.score_scale, s.eps, S);
  LayerOutput r;
  r.phi_hat = predict_phi(Psi, L.coef);
  auto f_hat = dual_from_phi(r.phi_hat, cost_alpha(q, s.score_scale), m);
  auto res = run_closures(S, f_hat, v.to(q.scalar_type()), m, c, closures, opt.return_attention);
  r.out = res.O;
  r.attention = res.A;
  return r;
}

LayerOutput run_layer(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& key_mask, const RunOptions& opt) {
  if (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) {
    // Half precision in, half precision out: computed in float32 (issue 16, item 7).
    auto r = run_layer(L, q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), key_mask, opt);
    for (at::Tensor* t : {&r.out, &r.attention, &r.phi_hat})
      if (t->defined()) *t = t->to(q.scalar_type());
    return r;
  }
  LayerOutput r = L.kind != OperatorKind::kAsap
                      ? run_loop_kind(L, q, k, v, key_mask, opt,
                                      [](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_,
                                         const at::Tensor& m_, double sc, int steps, const Convention& c, bool wa) {
                                        return run_teacher(q_, k_, v_, m_, sc, steps, c, wa, /*want_duals=*/false);
                                      })
                      : fast::asap_layer(L, q, k, v, key_mask, opt.closures, opt.return_attention);  // other devices: the reference
  propagate_nonfinite(r, q, k, v);
  return r;
}

std::shared_ptr<const CompiledModel> CompiledModel::load(const std::string& path) {
  return std::make_shared<const CompiledModel>(read_artifact(path), path);
}

CompiledModel::CompiledModel(Artifact artifact, std::string path) : art_(std::move(artifact)), path_(std::move(path)) {}

std::vector<std::string> CompiledModel::layer_names() const {
  std::vector<std::string> names;
  for (const auto& l : art_.layers) names.push_back(l.spec.name);
  return names;
}

const CompiledLayer& CompiledModel::layer(const std::string& name) const {
  const CompiledLayer* l = art_.find(name);
  if (!l) {
    std::string have;
    for (const auto& x : art_.layers) have += (have.empty() ? "'" : ", '") + x.spec.name + "'";
    throw Error(str("artifact '", path_, "' has no layer '", name, "' (it has ", have, ")"));
  }
  return *l;
}

LayerOutput CompiledModel::attend(const std::string& name, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& key_mask, const RunOptions& opt) const {
  return run_layer(layer(name), q, k, v, key_mask, opt);
}

at::Tensor CompiledModel::forward(const std::string& name, const at::Tensor& x, const at::Tensor& key_mask,
                                  const RunOptions& opt) const {
  const CompiledLayer& L = layer(name);
  ASAP_CHECK(L.weights.defined(), "artifact '", path_, "' layer '", name,
             "' carries no projection weights (it was compiled from per-head q, k, v): call attend() instead");
  auto qkv = project_qkv(L.spec, L.weights, x);
  auto r = run_layer(L, qkv.q, qkv.k, qkv.v, key_mask, opt);
  return merge_heads(L.spec, L.weights, r.out);
}

}  // namespace asap
