// reference/fit.h -- fitting the coefficients (asap-math.md section 6).
//
// LS sufficient statistics are kept per head for the widest feature family
// compiled; pooled statistics, nested slice prefixes and narrower families
// are sums and sub-blocks of them, so every ridge/slice/family choice is
// evaluated on held-out statistics without another pass over the data.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "asap/types.h"

namespace asap {

struct LsStats {
  at::Tensor G;          // [H, P, P] float64: sum Psi^T Psi per head
  at::Tensor h;          // [H, P]    float64: sum Psi^T phi_bar*
  at::Tensor c;          // [H]       float64: sum ||phi_bar*||^2
  at::Tensor R;          // [H]       float64: mass-carrying rows
  int64_t examples = 0;  // sequences accumulated (each contributes H terms)

  bool empty() const { return !G.defined(); }
  void add(const LsStats& other);
};

// Adds one batch: Psi [B, H, n, P], target [B, H, n] (values on rows
// without mass are ignored), row_active [B, 1, n] bool.
void accumulate_ls(LsStats& stats, const at::Tensor& Psi, const at::Tensor& target, const at::Tensor& row_active);

// Columns of the widest family that a narrower family uses (slice prefix
// plus its extra columns), as indices into P.
std::vector<int64_t> family_columns(const FeatureFamily& widest, const FeatureFamily& family);

// Ridge LS: beta = (G/R + lambda I)^-1 (h/R) on the selected columns.
// per_head: one row per head; else one pooled row. Returns [G, |cols|] float64.
at::Tensor solve_ls(const LsStats& s, const std::vector<int64_t>& cols, bool per_head, double lambda);

// Held-out mean squared dual error (beta^T G beta - 2 beta^T h + c) / R,
// pooled over heads (coef [1, |cols|] or [H, |cols|]).
double ls_mse(const LsStats& s, const std::vector<int64_t>& cols, const at::Tensor& coef);

// Held-out MSEs closer than this are a tie: 1e-9 of the held-out target's
// mean square (the MSE of the zero map), 0 without held-out rows. Sums over
// another split of the examples between processes move an MSE by about
// 1e-16 of that, and an exactly representable target's MSE is all such noise.
double ls_mse_tie(const LsStats& heldout);

// The default ridge grid: 0 and 10^-8 ... 10^0.
std::vector<double> default_ridge_grid();

struct RidgeChoice {
  double lambda = 0;
  double heldout_mse = 0;
  std::vector<double> grid, grid_mse;  // every candidate and its held-out MSE
};
// Picks the grid value with the lowest held-out MSE; among values within
// ls_mse_tie of it, the smallest lambda.
RidgeChoice choose_ridge(const LsStats& train, const LsStats& heldout, const std::vector<int64_t>& cols, bool per_head,
                         const std::vector<double>& grid);

}  // namespace asap
