// Ridge least squares from streamed sufficient statistics (asap-math.md
// section 6, LS part).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <Eigen/Dense>

#include <cmath>
#include <limits>

#include "asap/error.h"
#include "reference/fit.h"

namespace asap {

void LsStats::add(const LsStats& o) {
  if (o.empty()) return;
  if (empty()) {
    G = o.G.clone();
    h = o.h.clone();
    c = o.c.clone();
    R = o.R.clone();
    examples = o.examples;
    return;
  }
  ASAP_CHECK(G.sizes() == o.G.sizes(), "cannot add LS statistics of shapes ", G.sizes(), " and ", o.G.sizes());
  G.add_(o.G);
  h.add_(o.h);
  c.add_(o.c);
  R.add_(o.R);
  examples += o.examples;
}

void accumulate_ls(LsStats& s, const at::Tensor& Psi, const at::Tensor& target, const at::Tensor& row_active) {
  ASAP_CHECK(Psi.dim() == 4 && target.dim() == 3 && Psi.size(0) == target.size(0) && Psi.size(1) == target.size(1) &&
                 Psi.size(2) == target.size(2),
             "LS statistics: features ", Psi.sizes(), " do not match targets ", target.sizes());
  const int64_t B = Psi.size(0), H = Psi.size(1), n = Psi.size(2), P = Psi.size(3);
  auto w = row_active.expand({B, H, n}).to(at::kDouble);  // 1 on rows that carry mass
  auto X = Psi.to(at::kDouble) * w.unsqueeze(-1);
  auto y = at::where(row_active.expand({B, H, n}), target.to(at::kDouble), at::zeros({}, at::kDouble));
  // Per head: sum over batch and rows; heads spread over threads. Eigen's
  // own product, not BLAS: a BLAS call inside parallel_for nests thread pools
  // (safe only with a one-thread BLAS, which library callers need not have);
  // Eigen runs single-threaded inside a parallel region.
  auto Xh = X.transpose(0, 1).reshape({H, B * n, P}).contiguous();
  auto yh = y.transpose(0, 1).reshape({H, B * n}).contiguous();
  LsStats b;
  b.G = at::empty({H, P, P}, X.options());
  b.h = at::empty({H, P}, X.options());
  using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t rows = B * n;
  const double* xp = Xh.data_ptr<double>();
  const double* yp = yh.data_ptr<double>();
  double* gp = b.G.data_ptr<double>();
  double* hp = b.h.data_ptr<double>();
  at::parallel_for(0, H, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t hd = h0; hd < h1; ++hd) {
      Eigen::Map<const RowMat> x(xp + hd * rows * P, rows, P);
      Eigen::Map<const Eigen::VectorXd> yv(yp + hd * rows, rows);
      Eigen::Map<RowMat> G(gp + hd * P * P, P, P);
      Eigen::MatrixXd low = Eigen::MatrixXd::Zero(P, P);  // X^T X from one triangle: half the flops
      low.selfadjointView<Eigen::Lower>().rankUpdate(x.transpose());
      G = low.selfadjointView<Eigen::Lower>();
      Eigen::Map<Eigen::VectorXd>(hp + hd * P, P).noalias() = x.transpose() * yv;
    }
  });
  b.c = yh.pow(2).sum(1);
  b.R = w.sum(at::IntArrayRef{0, 2});
  b.examples = B;
  s.add(b);
}

std::vector<int64_t> family_columns(const FeatureFamily& widest, const FeatureFamily& f) {
  ASAP_CHECK(f.slices <= widest.slices && (!f.alpha || widest.alpha) && (!f.softmax_dual || widest.softmax_dual) &&
                 (!f.sinkhorn_dual3 || widest.sinkhorn_dual3) && (!f.score_stats || widest.score_stats) &&
                 (!f.centered_stats || widest.centered_stats),
             "feature family ", f.name(), " is not contained in ", widest.name());
  std::vector<int64_t> cols;
  for (int64_t l = 0; l < f.slices; ++l) cols.push_back(l);
  int64_t next = widest.slices;
  if (widest.alpha) {
    if (f.alpha) cols.push_back(next);
    ++next;
  }
  if (widest.softmax_dual) {
    if (f.softmax_dual) cols.push_back(next);
    ++next;
  }
  if (widest.sinkhorn_dual3) {
    if (f.sinkhorn_dual3) cols.push_back(next);
    ++next;
  }
  if (widest.score_stats) {
    if (f.score_stats)
      for (int64_t c = 0; c < 3; ++c) cols.push_back(next + c);
    next += 3;
  }
  if (widest.centered_stats && f.centered_stats)
    for (int64_t c = 0; c < 2; ++c) cols.push_back(next + c);
  return cols;
}

namespace {

using Mat = Eigen::MatrixXd;
using Vec = Eigen::VectorXd;

// Sub-block of group g (or the sum over heads when g < 0).
void block(const LsStats& s, const std::vector<int64_t>& cols, int64_t g, Mat& G, Vec& h, double& c, double& R) {
  const int64_t H = s.G.size(0), P = static_cast<int64_t>(cols.size());
  auto Gall = (g < 0 ? s.G.sum(0) : s.G[g]).contiguous();
  auto hall = (g < 0 ? s.h.sum(0) : s.h[g]).contiguous();
  c = (g < 0 ? s.c.sum() : s.c[g]).item<double>();
  R = (g < 0 ? s.R.sum() : s.R[g]).item<double>();
  auto Ga = Gall.accessor<double, 2>();
  auto ha = hall.accessor<double, 1>();
  G.resize(P, P);
  h.resize(P);
  for (int64_t a = 0; a < P; ++a) {
    h(a) = ha[cols[a]];
    for (int64_t b = 0; b < P; ++b) G(a, b) = Ga[cols[a]][cols[b]];
  }
  (void)H;
}

}  // namespace

at::Tensor solve_ls(const LsStats& s, const std::vector<int64_t>& cols, bool per_head, double lambda) {
  ASAP_CHECK(!s.empty(), "LS fit: no calibration rows were accumulated");
  ASAP_CHECK(lambda >= 0 && std::isfinite(lambda), "ridge must be a finite number >= 0, found ", lambda);
  const int64_t H = s.G.size(0), P = static_cast<int64_t>(cols.size());
  const int64_t groups = per_head ? H : 1;
  auto out = at::zeros({groups, P}, at::kDouble);
  for (int64_t g = 0; g < groups; ++g) {
    Mat G;
    Vec h;
    double c, R;
    block(s, cols, per_head ? g : -1, G, h, c, R);
    ASAP_CHECK(R > 0, "LS fit: head ", g, " has no mass-carrying rows");
    Mat A = G / R;
    A.diagonal().array() += lambda;
    Vec rhs = h / R;
    // Complete orthogonal decomposition: a minimum-norm solution when lambda = 0 and G is singular.
    Vec beta = A.completeOrthogonalDecomposition().solve(rhs);
    for (int64_t a = 0; a < P; ++a) out[g][a] = beta(a);
  }
  return out;
}

double ls_mse(const LsStats& s, const std::vector<int64_t>& cols, const at::Tensor& coef) {
  const int64_t H = s.G.size(0), P = static_cast<int64_t>(cols.size());
  ASAP_CHECK(coef.dim() == 2 && coef.size(1) == P && (coef.size(0) == 1 || coef.size(0) == H), "coefficients of shape ",
             coef.sizes(), " do not fit ", P, " columns and ", H, " heads");
  double num = 0, rows = 0;
  for (int64_t g = 0; g < H; ++g) {
    Mat G;
    Vec h;
    double c, R;
    block(s, cols, g, G, h, c, R);
    Vec beta(P);
    auto row = coef[coef.size(0) == 1 ? 0 : g].contiguous();
    for (int64_t a = 0; a < P; ++a) beta(a) = row[a].item<double>();
    num += beta.dot(G * beta) - 2 * beta.dot(h) + c;
    rows += R;
  }
  ASAP_CHECK(rows > 0, "held-out split has no mass-carrying rows");
  // std::max(0.0, NaN) would be 0, the best possible error: keep NaN a NaN.
  return std::isnan(num) ? num : std::max(0.0, num / rows);
}

std::vector<double> default_ridge_grid() {
  std::vector<double> g{0.0};
  for (int e = -8; e <= 0; ++e) g.push_back(std::pow(10.0, e));
  return g;
}

double ls_mse_tie(const LsStats& heldout) {
  if (heldout.empty()) return 0;
  const double rows = heldout.R.sum().item<double>();
  return rows > 0 ? 1e-9 * std::abs(heldout.c.sum().item<double>()) / rows : 0;
}

RidgeChoice choose_ridge(const LsStats& train, const LsStats& heldout, const std::vector<int64_t>& cols, bool per_head,
                         const std::vector<double>& grid) {
  ASAP_CHECK(!grid.empty(), "ridge grid is empty");
  RidgeChoice best;
  double low = std::numeric_limits<double>::infinity();
  for (double lam : grid) {
    const double mse = ls_mse(heldout, cols, solve_ls(train, cols, per_head, lam));
    best.grid.push_back(lam);
    best.grid_mse.push_back(mse);
    if (mse < low) low = mse;
  }
  // Within rounding of the lowest: the smallest ridge, whatever the order of
  // the grid or the rounding of the sums (1 and several processes agree).
  const double tie = ls_mse_tie(heldout);
  best.heldout_mse = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < grid.size(); ++i)
    if (best.grid_mse[i] <= low + tie && (std::isinf(best.heldout_mse) || grid[i] < best.lambda)) {
      best.heldout_mse = best.grid_mse[i];
      best.lambda = grid[i];
    }
  // No ridge gave a comparable error (all NaN): say so rather than report +inf.
  if (std::isinf(best.heldout_mse)) best.heldout_mse = std::numeric_limits<double>::quiet_NaN();
  return best;
}

}  // namespace asap
