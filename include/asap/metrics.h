// asap/metrics.h -- fidelity metrics against the teacher (asap-math.md
// section 7). One implementation serves compile's held-out choice, its
// report, and `asapc verify`.
#pragma once
#include <ATen/core/Tensor.h>
#include <vector>

#include <cstdint>

#include "asap/teacher.h"

namespace asap {

struct FidelityMetrics {
  double attention_rel_error = 0;      // mean over (example, head) of ||A - A*||_F / ||A*||_F
  double head_output_rmse = 0;         // sqrt(mean (O - O*)^2) over head outputs
  double layer_output_rmse = -1;       // after merging heads and the output projection (-1: not measured)
  double row_marginal_error = 0;       // mean over mass-carrying rows of |sum_j A_ij - 1|
  double col_marginal_error = 0;       // mean over active columns of |sum_i A_ij - 1|
  double teacher_plan_kl = 0;          // mean over (example, head) of generalized KL(A*/n || A/n); +inf when
                                       // the operator gives 0 where the teacher does not
  double teacher_plan_kl_floored = 0;  // the same with A clamped below at kKlFloor (always finite)
  double plan_zero_share = 0;          // share of the teacher's nonzero entries where A is exactly 0
  double dual_rmse = -1;               // centered cost-coordinate dual RMSE (-1: not measured)
  int64_t terms = 0;                   // (example, head) pairs
};

// Accumulates metrics over batches; attention matrices are in n*plan units
// (pass multiply_by_n=false for teachers whose attention is the plan).
// Attention weight below which the floored plan KL clamps the operator's.
constexpr double kKlFloor = 1e-12;

class MetricsAccumulator {
 public:
  // A, A_star [B, H, n, n]; marginal errors are those of A.
  void add_attention(const at::Tensor& A, const at::Tensor& A_star, const LogMarginals& m, bool multiply_by_n);
  void add_head_outputs(const at::Tensor& O, const at::Tensor& O_star);
  void add_layer_outputs(const at::Tensor& Y, const at::Tensor& Y_star);
  // Centered duals in cost coordinates, [B, H, n]; rows without mass ignored.
  void add_dual(const at::Tensor& phi_hat, const at::Tensor& phi_bar_star, const LogMarginals& m);
  FidelityMetrics result() const;
  // The running sums, to add accumulators of several processes (asap/dist.h).
  void append_sums(std::vector<double>& out) const;
  // Replaces the sums by out[offset ...] and advances offset.
  void load_sums(const std::vector<double>& in, size_t& offset);

 private:
  double rel_sum_ = 0, kl_sum_ = 0, kl_floor_sum_ = 0, zero_entries_ = 0, support_entries_ = 0, row_sum_ = 0,
         col_sum_ = 0;
  double rows_ = 0, cols_ = 0;
  int64_t terms_ = 0;
  double o_sq_ = 0, o_count_ = 0, y_sq_ = 0, y_count_ = 0, d_sq_ = 0, d_count_ = 0;
};

}  // namespace asap
