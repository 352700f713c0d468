// ASAP-KL (asap-math.md section 6, KL part): golden fit, derivatives against
// finite differences, monotone Newton, and streaming.
#include <ATen/ATen.h>

#include "asap/features.h"
#include "asap/runtime.h"
#include "asap/teacher.h"
#include "compile/kl_fit.h"
#include "reference/fit.h"
#include "test_util.h"

using asap_test::load_json;
using asap_test::tensor_from_json;

namespace {

// Golden examples as KL batches of one example each.
std::vector<asap::KlBatch> golden_batches(const nlohmann::json& j) {
  auto theta = tensor_from_json(j["Theta"]);
  const double s = j["score_scale"].get<double>();
  asap::FeatureFamily fam{theta.size(1), false, false};
  std::vector<asap::KlBatch> out;
  for (const auto& e : j["examples"]) {
    auto Q = tensor_from_json(e["Q"]).unsqueeze(0).unsqueeze(0);
    auto K = tensor_from_json(e["K"]).unsqueeze(0).unsqueeze(0);
    auto mask = tensor_from_json(e["key_mask"]).gt(0.5).unsqueeze(0);
    auto m = asap::log_marginals(mask, 1, Q.size(2), false, at::kDouble, at::kCPU);
    auto t = asap::run_teacher(Q, K, at::Tensor(), mask, s, j["T"].get<int>(), {}, false);
    auto Psi = asap::build_features(Q, K, m, theta, fam, s, 1.0);
    out.push_back(asap::make_kl_batch(Q, K, mask, t.f_star, Psi, s, 1.0, false));
  }
  return out;
}

asap::KlSource source_of(const std::vector<asap::KlBatch>& bs) {
  return [&bs](const std::function<void(const asap::KlBatch&)>& fn) {
    for (const auto& b : bs) fn(b);
  };
}

// Random padded multi-head batch.
asap::KlBatch random_batch(int64_t B, int64_t H, int64_t n, int64_t L, uint64_t seed, bool drop) {
  at::manual_seed(seed);
  auto q = at::randn({B, H, n, 4}, at::kDouble), k = at::randn({B, H, n, 4}, at::kDouble);
  auto mask = at::ones({B, n}, at::kBool);
  mask[0].slice(0, n - 2).fill_(false);
  auto m = asap::log_marginals(mask, B, n, drop, at::kDouble, at::kCPU);
  auto t = asap::run_teacher(q, k, at::Tensor(), mask, 0.5, 6, asap::Convention{1.0, drop, true}, false);
  asap::FeatureFamily fam{L, true, true};
  auto Psi = asap::build_features(q, k, m, asap::make_slice_bank(4, L, seed), fam, 0.5, 1.0);
  return asap::make_kl_batch(q, k, mask, t.f_star, Psi, 0.5, 1.0, drop);
}

}  // namespace

TEST_CASE("kl: golden coefficients and objective from the LS warm start") {
  auto j = load_json("fit.json");
  auto bs = golden_batches(j);
  auto src = source_of(bs);
  const double lam = j["kl_ridge"].get<double>();
  auto coef_ls = tensor_from_json(j["ls_coef_by_ridge"]["0.001"]).unsqueeze(0);
  auto res = asap::kl_newton(src, coef_ls, 1.0, lam, 50, 1e-14);
  CHECK(res.converged);
  CHECK(res.history.front().objective == doctest::Approx(j["kl_objective_start"].get<double>()).epsilon(1e-10));
  CHECK(res.history.back().objective == doctest::Approx(j["kl_objective_end"].get<double>()).epsilon(1e-10));
  CHECK_CLOSE_T(res.coef[0], tensor_from_json(j["kl_coef"]), 1e-6);
  // The objective decreases monotonically.
  for (size_t i = 1; i < res.history.size(); ++i) CHECK(res.history[i].objective < res.history[i - 1].objective);
  // On the fit data the teacher-plan KL of the KL fit is not above the LS fit's.
  const double kl_ls = asap::kl_evaluate(src, coef_ls, 1.0, 0, false).kl;
  const double kl_kl = asap::kl_evaluate(src, res.coef, 1.0, 0, false).kl;
  CHECK(kl_kl <= kl_ls);
  CHECK(kl_kl >= 0);
}

TEST_CASE("kl: gradient and Hessian match finite differences (pooled, per head, padding, dropped rows)") {
  for (bool drop : {false, true})
    for (int64_t G : {1, 3}) {
      CAPTURE(drop);
      CAPTURE(G);
      std::vector<asap::KlBatch> bs{random_batch(2, 3, 9, 5, 40 + G, drop)};
      auto src = source_of(bs);
      const int64_t P = bs[0].Psi.size(3);
      at::manual_seed(7);
      auto beta = 0.3 * at::randn({G, P}, at::kDouble);
      const double lam = 0.01, h = 1e-5;
      auto v = asap::kl_evaluate(src, beta, 1.0, lam, true);
      auto num_grad = at::zeros_like(beta);
      auto num_hess = at::zeros({G, P, P}, at::kDouble);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t a = 0; a < P; ++a) {
          auto e = at::zeros_like(beta);
          e[g][a] = h;
          auto vp = asap::kl_evaluate(src, beta + e, 1.0, lam, true),
               vm = asap::kl_evaluate(src, beta - e, 1.0, lam, true);
          num_grad[g][a] = (vp.F - vm.F) / (2 * h);
          num_hess[g].select(1, a).copy_((vp.grad[g] - vm.grad[g]) / (2 * h));
        }
      CHECK_CLOSE_T(v.grad, num_grad, 1e-7);
      CHECK_CLOSE_T(v.hess, num_hess, 1e-6);
      // The Hessian is symmetric positive definite (strong convexity with a ridge).
      for (int64_t g = 0; g < G; ++g) {
        CHECK_CLOSE_T(v.hess[g], v.hess[g].transpose(0, 1), 1e-12);
        CHECK(at::linalg_eigvalsh(v.hess[g]).min().item<double>() > 0);
      }
    }
}

TEST_CASE("kl: the reported KL is the generalized KL: zero when the prediction is the teacher's dual") {
  at::manual_seed(12);
  const int64_t n = 9;
  auto q = at::randn({2, 2, n, 4}, at::kDouble), k = at::randn({2, 2, n, 4}, at::kDouble);
  auto mask = at::ones({2, n}, at::kBool);
  mask[1].slice(0, 6).fill_(false);
  auto t = asap::run_teacher(q, k, at::Tensor(), mask, 0.5, 6, {}, false);
  auto m = asap::log_marginals(mask, 2, n, false, at::kDouble, at::kCPU);
  // One feature column holding the teacher's own centered cost-coordinate dual.
  auto Psi = t.phi_bar_star.unsqueeze(-1);
  auto kb = asap::make_kl_batch(q, k, mask, t.f_star, Psi, 0.5, 1.0, false);
  std::vector<asap::KlBatch> bs{kb};
  auto exact = at::ones({1, 1}, at::kDouble);
  CHECK(std::abs(asap::kl_evaluate(source_of(bs), exact, 1.0, 0, false).kl) < 1e-12);
  // Any other coefficient gives a strictly positive KL.
  CHECK(asap::kl_evaluate(source_of(bs), 0.5 * exact, 1.0, 0, false).kl > 1e-6);
  // And the gradient vanishes at the exact coefficient (r = r*).
  CHECK(asap::kl_evaluate(source_of(bs), exact, 1.0, 0, true).grad.abs().max().item<double>() < 1e-12);
}

TEST_CASE("kl: a streamed multi-batch fit equals the single-batch fit") {
  auto big = random_batch(6, 2, 8, 4, 77, false);
  std::vector<asap::KlBatch> one{big}, parts;
  for (int64_t s = 0; s < 6; s += 2) {
    asap::KlBatch p;
    p.Psi = big.Psi.slice(0, s, s + 2);
    p.M = big.M.slice(0, s, s + 2);
    p.b = big.b.slice(0, s, s + 2);
    p.rstar = big.rstar.slice(0, s, s + 2);
    p.kl_const = big.kl_const.slice(0, s, s + 2);
    parts.push_back(p);
  }
  auto coef0 = at::zeros({2, big.Psi.size(3)}, at::kDouble);
  auto a = asap::kl_newton(source_of(one), coef0, 1.0, 1e-3, 30, 1e-14);
  auto b = asap::kl_newton(source_of(parts), coef0, 1.0, 1e-3, 30, 1e-14);
  CHECK_CLOSE_T(a.coef, b.coef, 1e-10);
  CHECK(a.history.back().objective == doctest::Approx(b.history.back().objective).epsilon(1e-12));
}
