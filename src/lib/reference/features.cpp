// Sliced Kantorovich potentials and the extra dual features (asap-math.md
// sections 4 and 6b).
#include "asap/features.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "asap/error.h"
#include "util/potential.h"

namespace asap {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) {  // in (0, 1)
  return (static_cast<double>(splitmix64(state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Sorts idx[0..m) by key, ties by index (stable).
template <typename T>
void stable_order(const T* key, int64_t m, std::vector<int64_t>& idx) {
  idx.resize(m);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [key](int64_t a, int64_t b) { return key[a] < key[b]; });
}

// u at the sorted points: u_(1) = 0, slope ys_(r) on [xs_(r), xs_(r+1)].
void build_u(const std::vector<double>& xs, const std::vector<double>& ys, std::vector<double>& u) {
  u.resize(xs.size());
  u[0] = 0;
  for (size_t r = 0; r + 1 < xs.size(); ++r) u[r + 1] = u[r] + ys[r] * (xs[r + 1] - xs[r]);
}

}  // namespace

at::Tensor make_slice_bank(int64_t d, int64_t L, uint64_t seed) {
  ASAP_CHECK(d >= 1 && L >= 1, "slice bank: need d >= 1 and L >= 1, found d=", d, ", L=", L);
  auto theta = at::empty({d, L}, at::kDouble);
  auto acc = theta.accessor<double, 2>();
  uint64_t state = seed ^ 0x5A5Aa5a5C3C3F00Full;
  const double two_pi = 6.283185307179586;
  for (int64_t l = 0; l < L; ++l) {
    double norm2 = 0;
    for (int64_t i = 0; i < d; ++i) {
      const double u1 = uniform01(state), u2 = uniform01(state);
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2);
      acc[i][l] = z;
      norm2 += z * z;
    }
    const double inv = 1.0 / std::sqrt(norm2);
    for (int64_t i = 0; i < d; ++i) acc[i][l] *= inv;
  }
  return theta;
}

Potential1D::Potential1D(const double* x, const double* y, int64_t m) {
  ASAP_CHECK(m >= 1, "1-D potential needs at least one point");
  std::vector<int64_t> ix, iy;
  stable_order(x, m, ix);
  stable_order(y, m, iy);
  xs_.resize(m);
  ys_.resize(m);
  u_.resize(m);
  phi_in_.resize(m);
  for (int64_t r = 0; r < m; ++r) {
    xs_[r] = x[ix[r]];
    ys_[r] = y[iy[r]];
  }
  build_u(xs_, ys_, u_);
  for (int64_t r = 0; r < m; ++r) phi_in_[ix[r]] = 0.5 * xs_[r] * xs_[r] - u_[r];
}

double Potential1D::operator()(double p) const { return detail::eval_potential(xs_, ys_, u_, p); }

namespace {

// One slice of one (b, h): active tokens matched by rank, potentials written
// for every row (active: matched value; padded rows carrying mass: the
// extension; rows without mass: 0), then centered over rows carrying mass.
template <typename T>
void slice_potential(const T* x, const T* y, const bool* key_active, const bool* row_active, int64_t n,
                     std::vector<int64_t>& ix, std::vector<int64_t>& iy, std::vector<double>& xs,
                     std::vector<double>& ys, std::vector<double>& u, T* out, int64_t out_stride) {
  // Gather the active tokens.
  ix.clear();
  for (int64_t i = 0; i < n; ++i)
    if (key_active[i]) ix.push_back(i);
  const int64_t m = static_cast<int64_t>(ix.size());
  iy = ix;
  std::stable_sort(ix.begin(), ix.end(), [x](int64_t a, int64_t b) { return x[a] < x[b]; });
  std::stable_sort(iy.begin(), iy.end(), [y](int64_t a, int64_t b) { return y[a] < y[b]; });
  xs.resize(m);
  ys.resize(m);
  for (int64_t r = 0; r < m; ++r) {
    xs[r] = static_cast<double>(x[ix[r]]);
    ys[r] = static_cast<double>(y[iy[r]]);
  }
  build_u(xs, ys, u);
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < m; ++r) {
    const double v = 0.5 * xs[r] * xs[r] - u[r];
    out[ix[r] * out_stride] = static_cast<T>(v);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!row_active[i]) {
      out[i * out_stride] = T(0);
      continue;
    }
    if (!key_active[i])  // a padded query that carries mass: the extension
      out[i * out_stride] = static_cast<T>(detail::eval_potential(xs, ys, u, static_cast<double>(x[i])));
    sum += static_cast<double>(out[i * out_stride]);
    ++count;
  }
  const double mean = sum / static_cast<double>(count);
  for (int64_t i = 0; i < n; ++i)
    if (row_active[i]) out[i * out_stride] = static_cast<T>(static_cast<double>(out[i * out_stride]) - mean);
}

}  // namespace

at::Tensor sliced_potentials(const at::Tensor& q, const at::Tensor& k, const LogMarginals& m, const at::Tensor& theta,
                             int64_t L, double scale) {
  ASAP_CHECK(theta.dim() == 2 && theta.size(0) == q.size(-1), "slice bank: expected [", q.size(-1), ", L], found ",
             theta.sizes());
  ASAP_CHECK(L >= 1 && L <= theta.size(1), "slice count ", L, " outside the bank's 1..", theta.size(1));
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2);
  auto th = theta.slice(1, 0, L).to(q.scalar_type()).to(q.device()) * std::sqrt(scale);
  // Projections laid out [B, H, L, n] so each slice is contiguous.
  auto X = at::matmul(q, th).transpose(-1, -2).contiguous().cpu();
  auto Y = at::matmul(k, th).transpose(-1, -2).contiguous().cpu();
  auto out = at::empty({B, H, L, n}, X.options());
  auto key_active = m.key_active.expand({B, 1, n}).contiguous().cpu();
  auto row_active = m.row_active.expand({B, 1, n}).contiguous().cpu();
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "sliced_potentials", [&] {
    const scalar_t* xp = X.data_ptr<scalar_t>();
    const scalar_t* yp = Y.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const bool* ka = key_active.data_ptr<bool>();
    const bool* ra = row_active.data_ptr<bool>();
    at::parallel_for(0, B * H * L, 1, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> ix, iy;
      std::vector<double> xs, ys, u;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t b = t / (H * L);
        slice_potential<scalar_t>(xp + t * n, yp + t * n, ka + b * n, ra + b * n, n, ix, iy, xs, ys, u, op + t * n, 1);
      }
    });
  });
  return out.transpose(-1, -2).to(q.device());  // [B, H, n, L]
}

at::Tensor build_features(const at::Tensor& q, const at::Tensor& k, const LogMarginals& m, const at::Tensor& theta,
                          const FeatureFamily& family, double scale, double eps, const at::Tensor& S) {
  ASAP_CHECK(family.num_columns() >= 1, "feature family has no columns");
  std::vector<at::Tensor> cols;
  if (family.slices > 0) cols.push_back(sliced_potentials(q, k, m, theta, family.slices, scale));
  at::Tensor alpha;
  if (family.alpha || family.softmax_dual || family.sinkhorn_dual3) alpha = cost_alpha(q, scale);
  if (family.alpha) cols.push_back(center_rows(alpha, m).unsqueeze(-1));
  if (family.softmax_dual || family.sinkhorn_dual3) {
    // The teacher's own first steps from g = 0: f1 = row(0), f3 = row(col(f1)).
    auto Sx = S.defined() ? S : scores(q, k, scale);
    auto g0 = at::zeros({q.size(0), q.size(1), q.size(2)}, q.options())
                  .masked_fill(m.key_active.logical_not(), -std::numeric_limits<double>::infinity());
    auto f1 = row_closure(Sx, g0, m, eps);
    // Duals are -inf on rows without mass; center_rows puts 0 there.
    auto column = [&](const at::Tensor& f) {
      return center_rows(at::where(m.row_active, f + alpha, at::zeros_like(f)), m).unsqueeze(-1);
    };
    if (family.softmax_dual) cols.push_back(column(f1));
    if (family.sinkhorn_dual3) cols.push_back(column(row_closure(Sx, col_closure(Sx, f1, m, eps), m, eps)));
  }
  if (family.score_stats) {
    // Each query row's scores over the active keys (docs/asap-math.md 6c):
    // max, mean and the standard deviation about the mean (two passes).
    auto Sx = S.defined() ? S : scores(q, k, scale);
    auto key = m.key_active.unsqueeze(-2);                                     // [B, 1, 1, n]
    auto count = m.key_active.sum(-1, /*keepdim=*/true).to(Sx.scalar_type());  // [B, 1, 1]
    auto zero = at::zeros({}, Sx.options());
    auto mx = Sx.masked_fill(key.logical_not(), -std::numeric_limits<double>::infinity()).amax(-1);
    auto mean = at::where(key, Sx, zero).sum(-1) / count;
    auto dev = at::where(key, Sx - mean.unsqueeze(-1), zero);
    auto sd = ((dev * dev).sum(-1) / count).sqrt();
    for (const auto& c : {mx, mean, sd}) cols.push_back(center_rows(c, m).unsqueeze(-1));
    if (family.centered_stats) {
      // The same rows less each key's column mean over the rows that carry
      // mass (docs/asap-math.md 6d): the max and the variance of S_ij - c_j.
      auto rows = m.row_active.unsqueeze(-1);                                                  // [B, 1, n, 1]
      auto nrows = m.row_active.sum(-1, /*keepdim=*/true).unsqueeze(-1).to(Sx.scalar_type());  // [B, 1, 1, 1]
      auto c = at::where(rows, Sx, zero).sum(-2, /*keepdim=*/true) / nrows;                    // [B, H, 1, n]
      auto Sc = Sx - c;
      auto mxc = Sc.masked_fill(key.logical_not(), -std::numeric_limits<double>::infinity()).amax(-1);
      auto meanc = at::where(key, Sc, zero).sum(-1) / count;
      auto devc = at::where(key, Sc - meanc.unsqueeze(-1), zero);
      auto varc = (devc * devc).sum(-1) / count;
      for (const auto& col : {mxc, varc}) cols.push_back(center_rows(col, m).unsqueeze(-1));
    }
  }
  return cols.size() == 1 ? cols[0].contiguous() : at::cat(cols, -1);
}

}  // namespace asap
