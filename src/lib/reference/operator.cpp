// The compiled operator's reference path (asap-math.md section 5).
#include "asap/operator.h"

#include <ATen/ATen.h>

#include <limits>

#include "asap/error.h"
#include "asap/features.h"
#include "model/layer_checks.h"

namespace asap {

at::Tensor predict_phi(const at::Tensor& Psi, const at::Tensor& coef) {
  ASAP_CHECK(Psi.dim() == 4, "features: expected [B, H, n, P], found ", Psi.sizes());
  ASAP_CHECK(coef.dim() == 2 && coef.size(1) == Psi.size(3) && (coef.size(0) == 1 || coef.size(0) == Psi.size(1)),
             "coefficients: expected [1, ", Psi.size(3), "] or [", Psi.size(1), ", ", Psi.size(3), "], found ",
             coef.sizes());
  auto c = coef.to(Psi.scalar_type()).to(Psi.device());  // [G, P]
  // [B, H, n, P] x [G, P] -> [B, H, n]; G broadcasts over heads.
  return (Psi * c.unsqueeze(1)).sum(-1);
}

at::Tensor dual_from_phi(const at::Tensor& phi_hat, const at::Tensor& alpha, const LogMarginals& m) {
  auto f = phi_hat - alpha;
  return f.masked_fill(m.row_active.logical_not(), -std::numeric_limits<double>::infinity());
}

void for_each_closure(const at::Tensor& S, const at::Tensor& f_hat, const LogMarginals& m, double eps, int k_max,
                      const std::function<void(int, const at::Tensor&, const at::Tensor&)>& step) {
  ASAP_CHECK(k_max >= 1, "number of closures must be at least 1, found ", k_max);
  at::Tensor f = f_hat, g;
  for (int t = 1; t <= k_max; ++t) {
    if (t % 2 == 1)
      g = col_closure(S, f, m, eps);
    else
      f = row_closure(S, g, m, eps);
    step(t, f, g);
  }
}

ClosureResult run_closures(const at::Tensor& S, const at::Tensor& f_hat, const at::Tensor& v, const LogMarginals& m,
                           const Convention& c, int k, bool want_attention) {
  ClosureResult r;
  for_each_closure(S, f_hat, m, c.eps, k, [&](int t, const at::Tensor& f, const at::Tensor& g) {
    if (t == k) r.f = f, r.g = g;
  });
  auto A = plan_attention(S, r.f, r.g, c);
  if (v.defined()) r.O = at::matmul(A, v);
  if (want_attention) r.A = A;
  return r;
}

LayerOutput run_layer_reference(const CompiledLayer& L, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& key_mask, const RunOptions& opt) {
  const LayerSpec& s = L.spec;
  detail::check_layer_inputs(L, q, k, v);
  if (L.kind != OperatorKind::kAsap) {
    // The zero-parameter kinds: the teacher's loop with T' (sinkhorn) or T (teacher) half-steps.
    const int steps = detail::loop_kind_steps(L, opt);
    auto t = run_teacher_reference(q, k, v.to(q.scalar_type()), key_mask, s.score_scale, steps, convention_of(s),
                                   opt.return_attention);
    LayerOutput r;
    r.out = t.O;
    r.attention = t.A;
    return r;
  }
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
  if (opt.return_features) r.features = Psi;
  auto f_hat = dual_from_phi(r.phi_hat, cost_alpha(q, s.score_scale), m);
  auto res = run_closures(S, f_hat, v.to(q.scalar_type()), m, c, closures, opt.return_attention);
  r.out = res.O;
  r.attention = res.A;
  return r;
}

}  // namespace asap
