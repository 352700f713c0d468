// The finite Sinkhorn teacher (asap-math.md sections 1-3), written with
// plain ATen ops: this is the reference path the fast kernels are tested
// against.
#include "asap/teacher.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "asap/error.h"

namespace asap {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}

LogMarginals log_marginals(const at::Tensor& key_mask, int64_t B, int64_t n, bool drop_padded_queries,
                           at::ScalarType dtype, at::Device device) {
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  LogMarginals m;
  const double log_n = -std::log(static_cast<double>(n));
  if (!key_mask.defined()) {
    m.log_a = at::full({B, 1, n}, log_n, opts);
    m.log_b = m.log_a;
    m.row_active = at::ones({B, 1, n}, opts.dtype(at::kBool));
    m.key_active = m.row_active;
    return m;
  }
  ASAP_CHECK(key_mask.dim() == 2 && key_mask.size(0) == B && key_mask.size(1) == n,
             "key-padding mask: expected shape [", B, ", ", n, "], found ", key_mask.sizes());
  auto active = key_mask.to(device, at::kBool).unsqueeze(1);  // [B,1,n]
  ASAP_CHECK(active.any(-1).all().item<bool>(), "key-padding mask: every sequence needs at least one token");
  m.key_active = active;
  m.log_b = at::full({B, 1, n}, log_n, opts).masked_fill(active.logical_not(), -kInf);
  if (drop_padded_queries) {
    m.row_active = active;
    m.log_a = m.log_b;
  } else {
    m.row_active = at::ones({B, 1, n}, opts.dtype(at::kBool));
    m.log_a = at::full({B, 1, n}, log_n, opts);
  }
  return m;
}

at::Tensor scores(const at::Tensor& q, const at::Tensor& k, double scale) {
  return at::matmul(q, k.transpose(-1, -2)).mul_(scale);
}

at::Tensor col_closure(const at::Tensor& S, const at::Tensor& f, const LogMarginals& m, double eps) {
  // LSE over queries i (dim -2) of (S_ij + f_i)/eps.
  auto lse = at::logsumexp((S + f.unsqueeze(-1)) / eps, {-2});  // [B,H,n]
  return eps * (m.log_b - lse);
}

at::Tensor row_closure(const at::Tensor& S, const at::Tensor& g, const LogMarginals& m, double eps) {
  auto lse = at::logsumexp((S + g.unsqueeze(-2)) / eps, {-1});  // [B,H,n]
  return eps * (m.log_a - lse);
}

at::Tensor plan_attention(const at::Tensor& S, const at::Tensor& f, const at::Tensor& g, const Convention& c) {
  auto P = at::exp((S + f.unsqueeze(-1) + g.unsqueeze(-2)) / c.eps);
  if (c.multiply_by_n) P.mul_(static_cast<double>(S.size(-1)));
  return P;
}

at::Tensor cost_alpha(const at::Tensor& q, double scale) { return 0.5 * scale * q.pow(2).sum(-1); }

at::Tensor center_rows(const at::Tensor& x, const LogMarginals& m, double fill) {
  auto active = m.row_active.expand_as(x);
  auto zero = at::zeros_like(x);
  auto xs = at::where(active, x, zero);
  auto count = active.sum(-1, /*keepdim=*/true).to(x.scalar_type());
  auto mean = xs.sum(-1, true) / count;
  return at::where(active, x - mean, at::full_like(x, fill));
}

TeacherResult run_teacher_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& key_mask, double scale, int T, const Convention& c,
                                    bool want_attention) {
  ASAP_CHECK(T >= 1, "Sinkhorn budget T must be at least 1, found ", T);
  ASAP_CHECK(q.dim() == 4 && k.dim() == 4 && q.sizes() == k.sizes(),
             "teacher: q and k must both be [B, H, n, d] with equal shapes, found ", q.sizes(), " and ", k.sizes());
  ASAP_CHECK(c.eps > 0, "entropy eps must be positive, found ", c.eps);
  const int64_t B = q.size(0), n = q.size(2);
  auto m = log_marginals(key_mask, B, n, c.drop_padded_queries, q.scalar_type(), q.device());
  auto S = scores(q, k, scale);
  // g starts at 0 on active keys; padded keys are -inf so they never carry mass.
  auto g = at::zeros({B, q.size(1), n}, q.options()).masked_fill(m.key_active.logical_not(), -kInf);
  auto f = at::zeros_like(g);
  at::Tensor f_star;
  for (int t = 1; t <= T; ++t) {
    if (t % 2 == 1) {
      f = row_closure(S, g, m, c.eps);
      // The source dual just before the final closure sequence (section 2).
      if ((T % 2 == 0 && t == T - 1) || (T % 2 == 1 && t == T - 2)) f_star = f;
    } else {
      g = col_closure(S, f, m, c.eps);
    }
  }
  TeacherResult r;
  r.f = f;
  r.g = g;
  at::Tensor A = plan_attention(S, f, g, c);
  if (v.defined()) r.O = at::matmul(A, v);
  if (want_attention) r.A = A;
  if (f_star.defined()) {
    r.f_star = f_star;
    r.phi_bar_star = center_rows(f_star + cost_alpha(q, scale), m, -kInf);
  }
  return r;
}

}  // namespace asap
