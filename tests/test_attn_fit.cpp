// The attention refit (--fit attention): the teacher's plan in the batch,
// the gradient through the closures against finite differences, and
// L-BFGS reaching an exactly representable target.
#include <ATen/ATen.h>

#include "asap/features.h"
#include "asap/teacher.h"
#include "compile/attn_fit.h"
#include "test_util.h"

namespace {

struct Case {
  at::Tensor q, k, mask;
  asap::Convention c;
};

Case random_case(int64_t B, int64_t H, int64_t n, uint64_t seed, bool drop) {
  at::manual_seed(seed);
  Case x;
  x.q = at::randn({B, H, n, 4}, at::kDouble);
  x.k = at::randn({B, H, n, 4}, at::kDouble);
  x.mask = at::ones({B, n}, at::kBool);
  x.mask[0].slice(0, n - 2).fill_(false);  // two padded keys in the first example
  x.c = asap::Convention{0.7, drop, true};
  return x;
}

asap::AttnBatch batch_of(const Case& x, const at::Tensor& Psi, double scale, int T) {
  return asap::make_attn_batch(x.q, x.k, x.mask, Psi, scale, x.c.eps, T, x.c.drop_padded_queries);
}

asap::AttnSource source_of(const std::vector<asap::AttnBatch>& bs) {
  return [&bs](const std::function<void(const asap::AttnBatch&)>& fn) {
    for (const auto& b : bs) fn(b);
  };
}

// One feature column, the teacher's row dual after T - k = 3 half-steps in
// cost coordinates: coefficient 1 followed by k = 3 closures is exactly the
// teacher (T = 6).
struct ExactCase {
  Case x;
  double scale = 0.5, eps = 0;
  at::Tensor col;
};

ExactCase exact_case() {
  ExactCase e;
  e.x = random_case(3, 2, 8, 21, false);
  e.eps = e.x.c.eps;
  const Case& x = e.x;
  auto f3 = asap::run_teacher_reference(x.q, x.k, at::Tensor(), x.mask, e.scale, 3, x.c, false).f;
  auto m = asap::log_marginals(x.mask, 3, 8, false, at::kDouble, at::kCPU);
  e.col = (f3 + asap::cost_alpha(x.q, e.scale)).masked_fill(m.row_active.logical_not(), 0.0).unsqueeze(-1);
  return e;
}

}  // namespace

TEST_CASE("attention refit: the batch's plan is the teacher's (up to its scale), padding and dropped rows") {
  for (bool drop : {false, true})
    for (int T : {3, 6}) {
      CAPTURE(drop);
      CAPTURE(T);
      auto x = random_case(2, 3, 7, 11 + T, drop);
      auto Psi = at::zeros({2, 3, 7, 1}, at::kDouble);
      auto b = batch_of(x, Psi, 0.5, T);
      auto A = asap::run_teacher_reference(x.q, x.k, at::Tensor(), x.mask, 0.5, T, x.c, true).A;
      // Relative Frobenius error is what the objective and compile's selection
      // use, so the plan only has to match up to one factor per head.
      auto norm = [](const at::Tensor& P) { return P / P.sum(at::IntArrayRef{-2, -1}, true); };
      CHECK_CLOSE_T(norm(b.Pstar), norm(A), 1e-10);
    }
}

TEST_CASE("attention refit: gradient matches finite differences (k = 1..4, pooled and per head)") {
  auto x = random_case(2, 3, 7, 5, true);
  auto m = asap::log_marginals(x.mask, 2, 7, true, at::kDouble, at::kCPU);
  asap::FeatureFamily fam{3, true, true};
  auto Psi = asap::build_features(x.q, x.k, m, asap::make_slice_bank(4, 3, 9), fam, 0.5, x.c.eps);
  std::vector<asap::AttnBatch> bs{batch_of(x, Psi, 0.5, 6)};
  auto src = source_of(bs);
  const int64_t P = Psi.size(3);
  for (int k : {1, 2, 3, 4})
    for (int64_t G : {1, 3}) {
      CAPTURE(k);
      CAPTURE(G);
      at::manual_seed(3 + G);
      auto beta = 0.2 * at::randn({G, P}, at::kDouble) + 0.3;
      at::Tensor grad;
      const double f = asap::attn_evaluate(src, beta, x.c.eps, k, &grad);
      CHECK(std::isfinite(f));
      CHECK(f > 0);
      auto num = at::zeros_like(beta);
      const double h = 1e-6;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t a = 0; a < P; ++a) {
          auto e = at::zeros_like(beta);
          e[g][a] = h;
          num[g][a] = (asap::attn_evaluate(src, beta + e, x.c.eps, k, nullptr) -
                       asap::attn_evaluate(src, beta - e, x.c.eps, k, nullptr)) /
                      (2 * h);
        }
      CHECK_CLOSE_T(grad, num, 1e-6);
    }
}

TEST_CASE("attention refit: L-BFGS finds a k-matched dual that reproduces the teacher's plan") {
  // The one feature column is the teacher's row dual after T - k = 3
  // half-steps in cost coordinates, so coefficient 1 followed by k = 3
  // closures is exactly the teacher (T = 6); start from 0.4.
  const auto [x, scale, eps, col] = exact_case();
  std::vector<asap::AttnBatch> bs{batch_of(x, col, scale, 6)};
  auto src = source_of(bs);
  CHECK(asap::attn_evaluate(src, at::ones({1, 1}, at::kDouble), eps, 3, nullptr) < 1e-20);
  asap::AttnFitOptions o;
  o.max_iters = 50;
  auto start = at::full({1, 1}, 0.4, at::kDouble);
  const double f0 = asap::attn_evaluate(src, start, eps, 3, nullptr);
  auto r = asap::refine_attention(src, &src, start, eps, 3, o);
  const double f1 = asap::attn_evaluate(src, r.coef, eps, 3, nullptr);
  CHECK(f0 > 1e-3);
  CHECK(f1 < 1e-8 * f0);
  CHECK(std::abs(r.coef.item<double>() - 1.0) < 1e-3);
  // The reported held-out objectives are those of the start and of the returned coefficients.
  CHECK(r.diagnostics.heldout_objective_ls == doctest::Approx(f0).epsilon(1e-12));
  CHECK(r.diagnostics.heldout_objective == doctest::Approx(f1).epsilon(1e-6));
}

TEST_CASE(
    "attention refit: the held-out best is kept, the LS start when training moves away from it, and the refit stops "
    "after `patience` checks without gain") {
  // Training data whose optimum is coefficient 1; held-out data built with
  // the column negated, whose optimum is -1. L-BFGS walks from 0.4 towards
  // 1, every held-out check is worse than the start, and the start is
  // what comes back (with its held-out objective).
  const auto [x, scale, eps, col] = exact_case();
  std::vector<asap::AttnBatch> train{batch_of(x, col, scale, 6)}, held{batch_of(x, -col, scale, 6)};
  auto tr = source_of(train), he = source_of(held);
  asap::AttnFitOptions o;
  o.max_iters = 30;
  o.check_every = 1;
  o.patience = 0;  // every iteration runs
  auto start = at::full({1, 1}, 0.4, at::kDouble);
  const double h0 = asap::attn_evaluate(he, start, eps, 3, nullptr);
  auto r = asap::refine_attention(tr, &he, start, eps, 3, o);
  CHECK(r.diagnostics.train_objective < 1e-3 * r.diagnostics.train_objective_ls);
  CHECK(r.diagnostics.best_iteration == 0);
  const bool capped = r.diagnostics.stopped.find("iteration cap") != std::string::npos;
  CHECK(capped == (r.diagnostics.iterations == o.max_iters));  // else L-BFGS ended on its own, and says why
  CHECK(r.coef.item<double>() == 0.4);
  CHECK(r.diagnostics.heldout_objective == doctest::Approx(h0).epsilon(1e-12));
  // And the held-out objective of the last iterate is indeed worse.
  const auto& hist = r.diagnostics.history;
  REQUIRE(hist.back().heldout.has_value());
  CHECK(*hist.back().heldout > h0);

  // With checks every 2 iterations and patience 2 the refit ends after
  // iteration 4, keeping the start.
  o.check_every = 2;
  o.patience = 2;
  auto p = asap::refine_attention(tr, &he, start, eps, 3, o);
  CHECK(p.diagnostics.iterations == 4);
  CHECK(p.diagnostics.history.size() == 5);  // the start and four iterations
  CHECK(p.diagnostics.best_iteration == 0);
  CHECK(p.coef.item<double>() == 0.4);
  CHECK(p.diagnostics.stopped.find("no better held-out objective in 2 checks") != std::string::npos);

  // Where the held-out objective keeps improving (held-out = training),
  // patience does not cut the refit short: it reaches the exact dual.
  auto q = asap::refine_attention(tr, &tr, start, eps, 3, o);
  CHECK(std::abs(q.coef.item<double>() - 1.0) < 1e-3);
  CHECK(q.diagnostics.best_iteration >= 4);
}
