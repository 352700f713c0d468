// Sliced potentials, feature columns and the operator against the golden
// float64 cases (asap-math.md sections 4-5), plus the section-5 properties.
#include <ATen/ATen.h>

#include <array>

#include "asap/features.h"
#include "asap/operator.h"
#include "asap/runtime.h"
#include "test_util.h"

using asap_test::load_json;
using asap_test::tensor_from_json;

TEST_CASE("features: 1-D potentials match golden values, ties included") {
  auto j = load_json("potential_1d.json");
  for (const auto& c : j["cases"]) {
    auto x = c["x"].get<std::vector<double>>(), y = c["y"].get<std::vector<double>>();
    CAPTURE(x.size());
    asap::Potential1D pot(x.data(), y.data(), static_cast<int64_t>(x.size()));
    auto expect = c["phi_uncentered"].get<std::vector<double>>();
    for (size_t i = 0; i < x.size(); ++i) CHECK(pot.at_inputs()[i] == doctest::Approx(expect[i]).epsilon(1e-12));
    auto probe = c["probe_x"].get<std::vector<double>>(), at_probe = c["phi_at_probe"].get<std::vector<double>>();
    for (size_t i = 0; i < probe.size(); ++i) CHECK(pot(probe[i]) == doctest::Approx(at_probe[i]).epsilon(1e-12));
  }
}

TEST_CASE("features: 1-D potential is a Kantorovich potential (c-concavity, tight on matched pairs)") {
  at::manual_seed(11);
  const int64_t m = 17;
  auto x = at::randn({m}, at::kDouble), y = at::randn({m}, at::kDouble);
  asap::Potential1D pot(x.data_ptr<double>(), y.data_ptr<double>(), m);
  // psi_j = min_i (x_i - y_j)^2/2 - phi_i; then phi_i + psi_j <= cost with equality on rank-matched pairs.
  auto xs = std::get<0>(x.sort()), ys = std::get<0>(y.sort());
  for (int64_t a = 0; a < m; ++a) {
    double yj = ys[a].item<double>();
    double psi = 1e300;
    for (int64_t i = 0; i < m; ++i) {
      double xi = x[i].item<double>();
      psi = std::min(psi, 0.5 * (xi - yj) * (xi - yj) - pot.at_inputs()[i]);
    }
    double xm = xs[a].item<double>();
    CHECK(pot(xm) + psi == doctest::Approx(0.5 * (xm - yj) * (xm - yj)).epsilon(1e-10));
  }
}

TEST_CASE("features: sliced potentials and operator closures match golden operator cases") {
  auto j = load_json("operator.json");
  int idx = 0;
  for (const auto& c : j["cases"]) {
    CAPTURE(idx++);
    auto Q = tensor_from_json(c["Q"]).unsqueeze(0).unsqueeze(0);
    auto K = tensor_from_json(c["K"]).unsqueeze(0).unsqueeze(0);
    auto V = tensor_from_json(c["V"]).unsqueeze(0).unsqueeze(0);
    auto mask = tensor_from_json(c["key_mask"]).gt(0.5).unsqueeze(0);
    auto theta = tensor_from_json(c["Theta"]);
    const double s = c["score_scale"].get<double>();
    const int64_t n = Q.size(2), L = theta.size(1);
    auto m = asap::log_marginals(mask, 1, n, false, at::kDouble, at::kCPU);
    asap::FeatureFamily fam;
    fam.slices = L;
    auto Psi = asap::build_features(Q, K, m, theta, fam, s, 1.0);
    CHECK_CLOSE_T(Psi[0][0], tensor_from_json(c["Psi"]), 1e-10);
    auto coef = tensor_from_json(c["coef"]).unsqueeze(0);
    auto phi = asap::predict_phi(Psi, coef);
    CHECK_CLOSE_T(phi[0][0], tensor_from_json(c["phi_hat"]), 1e-10);
    auto f_hat = asap::dual_from_phi(phi, asap::cost_alpha(Q, s), m);
    auto S = asap::scores(Q, K, s);
    asap::Convention conv;
    for (int k = 1; k <= 4; ++k) {
      CAPTURE(k);
      auto r = asap::run_closures(S, f_hat, V, m, conv, k, true);
      CHECK_CLOSE_T(r.A[0][0], tensor_from_json(c["A_by_closures"][std::to_string(k)]), 1e-10);
    }
  }
}

TEST_CASE("features: float32 path agrees with float64 to 1e-5 relative") {
  at::manual_seed(5);
  auto q = at::randn({2, 3, 20, 8}, at::kDouble), k = at::randn({2, 3, 20, 8}, at::kDouble);
  auto mask = at::ones({2, 20}, at::kBool);
  mask[0].slice(0, 13).fill_(false);
  auto theta = asap::make_slice_bank(8, 16, 7);
  asap::FeatureFamily fam{16, true, true};
  auto m64 = asap::log_marginals(mask, 2, 20, false, at::kDouble, at::kCPU);
  auto m32 = asap::log_marginals(mask, 2, 20, false, at::kFloat, at::kCPU);
  auto P64 = asap::build_features(q, k, m64, theta, fam, 0.35, 1.0);
  auto P32 = asap::build_features(q.to(at::kFloat), k.to(at::kFloat), m32, theta, fam, 0.35, 1.0);
  CHECK(P64.sizes() == std::vector<int64_t>{2, 3, 20, 18});
  CHECK_CLOSE_T(P32, P64, 1e-5 * (1 + P64.abs().max().item<double>()));
}

TEST_CASE("features: extra columns equal independent computations") {
  at::manual_seed(6);
  const int64_t n = 10;
  auto q = at::randn({1, 2, n, 4}, at::kDouble), k = at::randn({1, 2, n, 4}, at::kDouble);
  auto mask = at::ones({1, n}, at::kBool);
  mask[0].slice(0, 7).fill_(false);
  const double s = 0.5, eps = 0.8;
  auto m = asap::log_marginals(mask, 1, n, false, at::kDouble, at::kCPU);
  asap::FeatureFamily fam{0, true, true};
  auto Psi = asap::build_features(q, k, m, asap::make_slice_bank(4, 1, 1), fam, s, eps);
  for (int64_t h = 0; h < 2; ++h) {
    // alpha: (s/2)||q_i||^2 centered over all rows (every row carries mass here).
    std::vector<double> alpha(n), f1(n);
    for (int64_t i = 0; i < n; ++i) {
      alpha[i] = 0.5 * s * q[0][h][i].pow(2).sum().item<double>();
      // softmax dual: eps*log(1/n) - eps*log sum_{j active} exp(S_ij/eps), plus alpha.
      double acc = 0;
      for (int64_t j = 0; j < 7; ++j) acc += std::exp(s * q[0][h][i].dot(k[0][h][j]).item<double>() / eps);
      f1[i] = eps * std::log(1.0 / n) - eps * std::log(acc) + alpha[i];
    }
    double ma = 0, mf = 0;
    for (int64_t i = 0; i < n; ++i) ma += alpha[i] / n, mf += f1[i] / n;
    for (int64_t i = 0; i < n; ++i) {
      CHECK(Psi[0][h][i][0].item<double>() == doctest::Approx(alpha[i] - ma).epsilon(1e-12));
      CHECK(Psi[0][h][i][1].item<double>() == doctest::Approx(f1[i] - mf).epsilon(1e-12));
    }
  }
}

TEST_CASE("operator: exact teacher recovery from the exact dual, with and without padding") {
  at::manual_seed(8);
  const int64_t B = 2, H = 2, n = 12, d = 6;
  auto q = at::randn({B, H, n, d}), k = at::randn({B, H, n, d}), v = at::randn({B, H, n, 5});
  for (bool padded : {false, true}) {
    at::Tensor mask;
    if (padded) {
      mask = at::ones({B, n}, at::kBool);
      mask[1].slice(0, 8).fill_(false);
    }
    asap::Convention conv;
    auto m = asap::log_marginals(mask, B, n, false, at::kFloat, at::kCPU);
    auto S = asap::scores(q, k, 0.4);
    for (int T : {6, 5}) {
      CAPTURE(padded);
      CAPTURE(T);
      auto t = asap::run_teacher(q, k, v, mask, 0.4, T, conv);
      // Inject the exact dual through the cost-coordinate round trip.
      auto alpha = asap::cost_alpha(q, 0.4);
      auto f_hat = asap::dual_from_phi(t.phi_bar_star.masked_fill(m.row_active.logical_not(), 0), alpha, m);
      const int k_exact = (T % 2 == 0) ? 1 : 2;
      auto r = asap::run_closures(S, f_hat, v, m, conv, k_exact, true);
      CHECK_CLOSE_T(r.A, t.A, 1e-5);
      CHECK_CLOSE_T(r.O, t.O, 1e-5);
    }
  }
}

TEST_CASE("operator: permutation equivariance of features, dual and output") {
  at::manual_seed(9);
  const int64_t n = 11;
  auto q = at::randn({1, 2, n, 4}, at::kDouble), k = at::randn({1, 2, n, 4}, at::kDouble),
       v = at::randn({1, 2, n, 3}, at::kDouble);
  auto theta = asap::make_slice_bank(4, 8, 3);
  asap::FeatureFamily fam{8, true, true};
  auto coef = at::randn({2, 10}, at::kDouble);
  auto run = [&](const at::Tensor& Q, const at::Tensor& K, const at::Tensor& V) {
    auto m = asap::log_marginals(at::Tensor(), 1, n, false, at::kDouble, at::kCPU);
    auto Psi = asap::build_features(Q, K, m, theta, fam, 0.5, 1.0);
    auto f = asap::dual_from_phi(asap::predict_phi(Psi, coef), asap::cost_alpha(Q, 0.5), m);
    return asap::run_closures(asap::scores(Q, K, 0.5), f, V, m, {}, 3, false).O;
  };
  auto perm = at::randperm(n, at::kLong);
  auto O = run(q, k, v);
  auto Op = run(q.index_select(2, perm), k.index_select(2, perm), v.index_select(2, perm));
  CHECK_CLOSE_T(Op, O.index_select(2, perm), 1e-10);
}

TEST_CASE("features: the sinkhorn3 column is the teacher's own dual after three steps, centered") {
  at::manual_seed(13);
  const int64_t n = 11;
  auto q = at::randn({2, 3, n, 4}, at::kDouble), k = at::randn({2, 3, n, 4}, at::kDouble);
  auto mask = at::ones({2, n}, at::kBool);
  mask[1].slice(0, 8).fill_(false);
  const double s = 0.45, eps = 0.9;
  auto m = asap::log_marginals(mask, 2, n, false, at::kDouble, at::kCPU);
  asap::FeatureFamily fam{0, false, true, true};
  auto Psi = asap::build_features(q, k, m, asap::make_slice_bank(4, 1, 1), fam, s, eps);
  REQUIRE(Psi.size(-1) == 2);
  // Independent: the teacher with budget T = 3 ends with f3 (its final source dual).
  asap::Convention c;
  c.eps = eps;
  auto t3 = asap::run_teacher(q, k, at::Tensor(), mask, s, 3, c, false);
  auto t1 = asap::run_teacher(q, k, at::Tensor(), mask, s, 1, c, false);
  auto alpha = 0.5 * s * q.pow(2).sum(-1);
  auto centered = [](const at::Tensor& x) { return x - x.mean(-1, true); };
  CHECK_CLOSE_T(Psi.select(-1, 0), centered(t1.f + alpha), 1e-12);
  CHECK_CLOSE_T(Psi.select(-1, 1), centered(t3.f + alpha), 1e-12);
  // Cost: three passes before any closure.
  CHECK(fam.feature_passes() == 3);
  CHECK(asap::FeatureFamily{0, false, true, false}.feature_passes() == 1);
}

namespace {
// The statistics tests' inputs: 2 sequences of 9 tokens (keys 0..5 in the
// first, all 9 in the second), 2 heads of 4, float64.
struct StatsCase {
  int64_t n = 9, B = 2, H = 2;
  double s = 0.7, eps = 0.6;
  at::Tensor q, k, mask;
  explicit StatsCase(uint64_t seed) {
    at::manual_seed(seed);
    q = at::randn({B, H, n, 4}, at::kDouble), k = at::randn({B, H, n, 4}, at::kDouble);
    mask = at::ones({B, n}, at::kBool);
    mask[0].slice(0, 6).fill_(false);
  }
  int64_t keys(int64_t b) const { return b == 0 ? 6 : n; }
  double S(int64_t b, int64_t h, int64_t i, int64_t j) const { return s * q[b][h][i].dot(k[b][h][j]).item<double>(); }
  // {max, mean, population variance} of S_ij - shift[j] over the active keys j, by loops.
  std::array<double, 3> row(int64_t b, int64_t h, int64_t i, const std::vector<double>& shift) const {
    double mx = -1e300, sum = 0, sq = 0;
    for (int64_t j = 0; j < keys(b); ++j) mx = std::max(mx, S(b, h, i, j) - shift[j]), sum += S(b, h, i, j) - shift[j];
    const double mean = sum / keys(b);
    for (int64_t j = 0; j < keys(b); ++j) sq += (S(b, h, i, j) - shift[j] - mean) * (S(b, h, i, j) - shift[j] - mean);
    return {mx, mean, sq / keys(b)};
  }
};

// Psi[b][h][:, col] is stat centered over the first `rows` rows (those with mass) and 0 after.
void check_centered_column(const at::Tensor& Psi, int64_t b, int64_t h, int64_t col, const std::vector<double>& stat,
                           int64_t rows) {
  double mu = 0;
  for (int64_t i = 0; i < rows; ++i) mu += stat[i] / rows;
  for (size_t i = 0; i < stat.size(); ++i) {
    CAPTURE(col);
    CAPTURE(i);
    const double want = static_cast<int64_t>(i) < rows ? stat[i] - mu : 0.0;
    CHECK(Psi[b][h][i][col].item<double>() == doctest::Approx(want).epsilon(1e-12).scale(1.0));
  }
}
}  // namespace

TEST_CASE("features: the score_stats columns are each row's max, mean and standard deviation over the active keys") {
  const StatsCase c(17);
  for (bool drop : {false, true}) {
    CAPTURE(drop);
    auto m = asap::log_marginals(c.mask, c.B, c.n, drop, at::kDouble, at::kCPU);
    asap::FeatureFamily fam;
    fam.alpha = true, fam.score_stats = true;
    REQUIRE(fam.num_columns() == 4);
    CHECK(fam.feature_passes() == 0);  // no log-sum-exp pass
    CHECK(fam.name() == "alpha+stats");
    auto Psi = asap::build_features(c.q, c.k, m, asap::make_slice_bank(4, 1, 1), fam, c.s, c.eps);
    REQUIRE(Psi.size(-1) == 4);
    const std::vector<double> none(c.n, 0.0);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h) {
        std::vector<double> stat[3];
        for (int64_t i = 0; i < c.n; ++i) {
          const auto r = c.row(b, h, i, none);
          stat[0].push_back(r[0]), stat[1].push_back(r[1]), stat[2].push_back(std::sqrt(r[2]));
        }
        for (int col = 0; col < 3; ++col) check_centered_column(Psi, b, h, 1 + col, stat[col], drop ? c.keys(b) : c.n);
      }
  }
}

TEST_CASE("features: the centered_stats columns are the max and variance of each row of S_ij - c_j") {
  // c_j = the mean of key j's scores over the rows that carry mass
  // (docs/asap-math.md 6d), from plain loops.
  const StatsCase c(19);
  for (bool drop : {false, true}) {
    CAPTURE(drop);
    auto m = asap::log_marginals(c.mask, c.B, c.n, drop, at::kDouble, at::kCPU);
    asap::FeatureFamily fam;
    fam.alpha = true, fam.score_stats = true, fam.centered_stats = true;
    REQUIRE(fam.num_columns() == 6);
    CHECK(fam.stats_columns() == 5);
    CHECK(fam.feature_passes() == 0);  // no log-sum-exp pass
    CHECK(fam.name() == "alpha+cstats");
    auto Psi = asap::build_features(c.q, c.k, m, asap::make_slice_bank(4, 1, 1), fam, c.s, c.eps);
    REQUIRE(Psi.size(-1) == 6);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h) {
        const int64_t rows = drop ? c.keys(b) : c.n;  // rows that carry mass
        std::vector<double> cm(c.keys(b), 0.0);
        for (int64_t j = 0; j < c.keys(b); ++j)
          for (int64_t i = 0; i < rows; ++i) cm[j] += c.S(b, h, i, j) / rows;
        std::vector<double> stat[2];
        for (int64_t i = 0; i < c.n; ++i) {
          const auto r = c.row(b, h, i, cm);
          stat[0].push_back(r[0]), stat[1].push_back(r[2]);
        }
        for (int col = 0; col < 2; ++col) check_centered_column(Psi, b, h, 4 + col, stat[col], rows);
      }
  }
}
