#include "asap/metrics.h"

#include <ATen/ATen.h>

#include <cmath>

namespace asap {

void MetricsAccumulator::add_attention(const at::Tensor& A_in, const at::Tensor& As_in, const LogMarginals& m,
                                       bool multiply_by_n) {
  const int64_t B = A_in.size(0), H = A_in.size(1), n = A_in.size(2);
  const double to_n = multiply_by_n ? 1.0 : static_cast<double>(n);
  auto A = A_in.to(at::kDouble) * to_n, As = As_in.to(at::kDouble) * to_n;
  auto num = (A - As).pow(2).sum(at::IntArrayRef{-2, -1}).sqrt();
  auto den = As.pow(2).sum(at::IntArrayRef{-2, -1}).sqrt();
  rel_sum_ += (num / den).sum().item<double>();
  // Generalized KL(p || q) with p = A*/n, q = A/n: sum p log(p/q) - p + q (p = 0 terms give q).
  auto p = As / static_cast<double>(n), q = A / static_cast<double>(n);
  auto kl = at::where(p > 0, p * (p.log() - q.log()), at::zeros_like(p)) - p + q;
  kl_sum_ += kl.sum().item<double>();
  // Entries the operator underflows to 0 where the teacher has mass make the
  // KL infinite: count them, and report the KL with A floored as well.
  auto qf = at::clamp_min(q, kKlFloor / static_cast<double>(n));
  auto klf = at::where(p > 0, p * (p.log() - qf.log()), at::zeros_like(p)) - p + qf;
  kl_floor_sum_ += klf.sum().item<double>();
  auto support = p > 0;
  support_entries_ += support.sum().item<double>();
  zero_entries_ += support.logical_and(q == 0).sum().item<double>();
  auto rows = m.row_active.expand({B, H, n}).to(at::kDouble);
  auto cols = m.key_active.expand({B, H, n}).to(at::kDouble);
  row_sum_ += ((A.sum(-1) - 1).abs() * rows).sum().item<double>();
  col_sum_ += ((A.sum(-2) - 1).abs() * cols).sum().item<double>();
  rows_ += rows.sum().item<double>();
  cols_ += cols.sum().item<double>();
  terms_ += B * H;
}

void MetricsAccumulator::add_head_outputs(const at::Tensor& O, const at::Tensor& Os) {
  o_sq_ += (O.to(at::kDouble) - Os.to(at::kDouble)).pow(2).sum().item<double>();
  o_count_ += static_cast<double>(O.numel());
}

void MetricsAccumulator::add_layer_outputs(const at::Tensor& Y, const at::Tensor& Ys) {
  y_sq_ += (Y.to(at::kDouble) - Ys.to(at::kDouble)).pow(2).sum().item<double>();
  y_count_ += static_cast<double>(Y.numel());
}

void MetricsAccumulator::add_dual(const at::Tensor& phi_hat, const at::Tensor& phi_bar_star, const LogMarginals& m) {
  auto rows = m.row_active.expand_as(phi_hat);
  auto diff = at::where(rows, phi_hat.to(at::kDouble) - phi_bar_star.to(at::kDouble), at::zeros({}, at::kDouble));
  d_sq_ += diff.pow(2).sum().item<double>();
  d_count_ += rows.sum().item<double>();
}

FidelityMetrics MetricsAccumulator::result() const {
  FidelityMetrics r;
  r.terms = terms_;
  if (terms_ > 0) {
    r.attention_rel_error = rel_sum_ / static_cast<double>(terms_);
    r.teacher_plan_kl = kl_sum_ / static_cast<double>(terms_);
    r.teacher_plan_kl_floored = kl_floor_sum_ / static_cast<double>(terms_);
  }
  if (support_entries_ > 0) r.plan_zero_share = zero_entries_ / support_entries_;
  if (rows_ > 0) r.row_marginal_error = row_sum_ / rows_;
  if (cols_ > 0) r.col_marginal_error = col_sum_ / cols_;
  if (o_count_ > 0) r.head_output_rmse = std::sqrt(o_sq_ / o_count_);
  if (y_count_ > 0) r.layer_output_rmse = std::sqrt(y_sq_ / y_count_);
  if (d_count_ > 0) r.dual_rmse = std::sqrt(d_sq_ / d_count_);
  return r;
}

}  // namespace asap

namespace asap {

void MetricsAccumulator::append_sums(std::vector<double>& out) const {
  for (double x : {rel_sum_, kl_sum_, kl_floor_sum_, zero_entries_, support_entries_, row_sum_, col_sum_, rows_, cols_,
                   static_cast<double>(terms_), o_sq_, o_count_, y_sq_, y_count_, d_sq_, d_count_})
    out.push_back(x);
}

void MetricsAccumulator::load_sums(const std::vector<double>& in, size_t& o) {
  double* fields[] = {&rel_sum_, &kl_sum_, &kl_floor_sum_, &zero_entries_, &support_entries_, &row_sum_, &col_sum_,
                      &rows_,    &cols_,   nullptr,        &o_sq_,         &o_count_,         &y_sq_,    &y_count_,
                      &d_sq_,    &d_count_};
  for (double* f : fields) {
    if (f)
      *f = in.at(o);
    else
      terms_ = static_cast<int64_t>(in.at(o));
    ++o;
  }
}

}  // namespace asap
