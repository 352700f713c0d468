// LS sufficient statistics, coefficients and ridge selection (asap-math.md
// section 6) against the golden fit case and direct computations.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "asap/features.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "reference/fit.h"
#include "test_util.h"

using asap_test::load_json;
using asap_test::tensor_from_json;

namespace {

struct Example {
  at::Tensor Psi, target, row_active;
};

std::vector<Example> golden_examples(const nlohmann::json& j, asap::FeatureFamily& fam) {
  auto theta = tensor_from_json(j["Theta"]);
  fam = asap::FeatureFamily{theta.size(1), false, false};
  const double s = j["score_scale"].get<double>();
  const int T = j["T"].get<int>();
  std::vector<Example> out;
  for (const auto& e : j["examples"]) {
    auto Q = tensor_from_json(e["Q"]).unsqueeze(0).unsqueeze(0);
    auto K = tensor_from_json(e["K"]).unsqueeze(0).unsqueeze(0);
    auto mask = tensor_from_json(e["key_mask"]).gt(0.5).unsqueeze(0);
    auto m = asap::log_marginals(mask, 1, Q.size(2), false, at::kDouble, at::kCPU);
    auto t = asap::run_teacher(Q, K, at::Tensor(), mask, s, T, {}, false);
    out.push_back({asap::build_features(Q, K, m, theta, fam, s, 1.0), t.phi_bar_star, m.row_active});
  }
  return out;
}

}  // namespace

TEST_CASE("fit: LS statistics and coefficients match the golden fit case") {
  auto j = load_json("fit.json");
  asap::FeatureFamily fam;
  auto ex = golden_examples(j, fam);
  asap::LsStats s;
  for (const auto& e : ex) asap::accumulate_ls(s, e.Psi, e.target, e.row_active);
  CHECK_CLOSE_T(s.G[0], tensor_from_json(j["G"]), 1e-9);
  CHECK_CLOSE_T(s.h[0], tensor_from_json(j["h"]), 1e-9);
  CHECK(s.c[0].item<double>() == doctest::Approx(j["c"].get<double>()).epsilon(1e-12));
  CHECK(s.R[0].item<double>() == j["R"].get<double>());
  auto cols = asap::family_columns(fam, fam);
  for (const auto& kv : j["ls_coef_by_ridge"].items()) {
    const double lam = std::stod(kv.key());
    CAPTURE(lam);
    auto beta = asap::solve_ls(s, cols, false, lam);
    CHECK_CLOSE_T(beta[0], tensor_from_json(kv.value()), 1e-8);
  }
}

TEST_CASE("fit: statistics over many small batches equal one large batch") {
  at::manual_seed(21);
  const int64_t N = 12, H = 3, n = 9, P = 5;
  auto Psi = at::randn({N, H, n, P}, at::kDouble), y = at::randn({N, H, n}, at::kDouble);
  auto rows = at::rand({N, 1, n}).gt(0.2);
  asap::LsStats whole, parts;
  asap::accumulate_ls(whole, Psi, y, rows);
  for (int64_t b = 0; b < N; b += 5) {
    const int64_t e = std::min(N, b + 5);
    asap::accumulate_ls(parts, Psi.slice(0, b, e), y.slice(0, b, e), rows.slice(0, b, e));
  }
  CHECK_CLOSE_T(parts.G, whole.G, 1e-10);
  CHECK_CLOSE_T(parts.h, whole.h, 1e-10);
  CHECK_CLOSE_T(parts.c, whole.c, 1e-10);
  CHECK_CLOSE_T(parts.R, whole.R, 0.0);
  CHECK(parts.examples == N);
}

TEST_CASE("fit: held-out MSE from statistics equals the direct computation; ridge choice is its argmin") {
  at::manual_seed(22);
  const int64_t H = 2, n = 8, P = 4;
  auto make = [&](int64_t N, uint64_t seed) {
    at::manual_seed(seed);
    auto Psi = at::randn({N, H, n, P}, at::kDouble);
    auto beta = at::tensor({0.5, -1.0, 2.0, 0.1}, at::kDouble);
    auto y = (Psi * beta).sum(-1) + 0.8 * at::randn({N, H, n}, at::kDouble);
    return std::make_tuple(Psi, y, at::ones({N, 1, n}, at::kBool));
  };
  auto [Pt, yt, rt] = make(6, 1);
  auto [Pv, yv, rv] = make(5, 2);
  asap::LsStats tr, va;
  asap::accumulate_ls(tr, Pt, yt, rt);
  asap::accumulate_ls(va, Pv, yv, rv);
  std::vector<int64_t> cols{0, 1, 2, 3};
  std::vector<double> grid{0.0, 1e-3, 0.1, 1.0, 10.0, 100.0};
  double best = 1e300, best_lam = -1;
  for (double lam : grid) {
    auto coef = asap::solve_ls(tr, cols, true, lam);
    // Direct held-out MSE.
    auto pred = (Pv * coef.unsqueeze(1)).sum(-1);
    const double direct = (pred - yv).pow(2).mean().item<double>();
    CHECK(asap::ls_mse(va, cols, coef) == doctest::Approx(direct).epsilon(1e-9));
    if (direct < best) best = direct, best_lam = lam;
  }
  auto choice = asap::choose_ridge(tr, va, cols, true, grid);
  CHECK(choice.lambda == best_lam);
  CHECK(choice.heldout_mse == doctest::Approx(best).epsilon(1e-9));

  // Held-out statistics holding a NaN give no comparable ridge: the choice
  // says NaN (compile then names the candidate) instead of +inf.
  asap::LsStats bad = va;
  bad.c = bad.c.clone();
  bad.c[0] = std::numeric_limits<double>::quiet_NaN();
  bad.G = bad.G.clone();
  bad.G[0][0][0] = std::numeric_limits<double>::quiet_NaN();
  CHECK(std::isnan(asap::choose_ridge(tr, bad, cols, true, grid).heldout_mse));
}

TEST_CASE("fit: per-head coefficients recover distinct per-head maps") {
  at::manual_seed(23);
  const int64_t N = 10, H = 2, n = 12, P = 3;
  auto Psi = at::randn({N, H, n, P}, at::kDouble);
  auto truth = at::tensor({1.0, 2.0, -1.0, -3.0, 0.5, 4.0}, at::kDouble).reshape({H, P});
  auto y = (Psi * truth.unsqueeze(1)).sum(-1);
  asap::LsStats s;
  asap::accumulate_ls(s, Psi, y, at::ones({N, 1, n}, at::kBool));
  auto coef = asap::solve_ls(s, {0, 1, 2}, true, 0.0);
  CHECK_CLOSE_T(coef, truth, 1e-9);
  auto pooled = asap::solve_ls(s, {0, 1, 2}, false, 0.0);
  CHECK(pooled.size(0) == 1);
  CHECK(asap::ls_mse(s, {0, 1, 2}, pooled) > 0.1);
  // Sub-families are sub-blocks: fitting columns {0, 2} equals fitting a 2-column design.
  asap::LsStats s2;
  asap::accumulate_ls(s2, Psi.index_select(3, at::tensor({0, 2}, at::kLong)), y, at::ones({N, 1, n}, at::kBool));
  CHECK_CLOSE_T(asap::solve_ls(s, {0, 2}, true, 0.01), asap::solve_ls(s2, {0, 1}, true, 0.01), 1e-10);
}
