// The model-level budget's solver (src/lib/compile/budget.h) against
// brute-force enumeration on synthetic layers with injected latencies.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "compile/budget.h"

namespace cd = asap::compile_detail;

namespace {

// Random layers: errors and latencies from a few levels, so that ties and near ties occur.
std::vector<cd::BudgetLayer> random_layers(std::mt19937& rng, int n_layers, int max_points) {
  std::uniform_int_distribution<int> np(1, max_points), lvl(1, 6);
  std::uniform_real_distribution<double> scale(0.5, 2.0);
  std::vector<cd::BudgetLayer> layers(n_layers);
  for (auto& l : layers) {
    const int n = np(rng);
    // Errors a level apart, or 3% apart (within kMaxErrorTie of each other).
    for (int i = 0; i < n; ++i) l.points.push_back({0.05 * lvl(rng) * (rng() % 2 ? 1.03 : 1.0), 1e-5 * lvl(rng)});
    l.error_scale = scale(rng);
    l.weight = (rng() % 3 == 0) ? 2.0 : 1.0;
  }
  return layers;
}

struct Best {
  bool feasible = false;
  double model_error = 0, error_sum = 0, latency = 0;
};

double sum_errors(const std::vector<cd::BudgetLayer>& layers, const std::vector<int>& c) {
  return cd::model_error(layers, c, cd::ModelError::kSum);
}

// Every choice of every point (not only the frontiers), ranked as the solver ranks them.
template <class Better>
Best brute_force(const std::vector<cd::BudgetLayer>& layers, cd::ModelError kind, double max_latency, double max_error,
                 Better better) {
  Best best;
  std::vector<int> c(layers.size(), 0);
  while (true) {
    double lat = 0;
    for (size_t l = 0; l < layers.size(); ++l) lat += layers[l].points[c[l]].latency;
    const double me = cd::model_error(layers, c, kind);
    if (lat <= max_latency && me <= max_error) {
      Best b{true, me, sum_errors(layers, c), lat};
      if (!best.feasible || better(b, best)) best = b;
    }
    size_t l = 0;
    while (l < layers.size() && ++c[l] == static_cast<int>(layers[l].points.size())) c[l++] = 0;
    if (l == layers.size()) break;
  }
  return best;
}

}  // namespace

TEST_CASE("budget: the Pareto frontier keeps exactly the points no other point beats") {
  std::vector<cd::BudgetPoint> p{{0.3, 1.0}, {0.2, 2.0}, {0.25, 3.0}, {0.2, 2.0}, {0.1, 5.0}, {0.4, 0.5}, {0.1, 6.0}};
  // 2 is beaten by 1, 3 duplicates 1 (the lower index stays), 6 is beaten by 4.
  CHECK(cd::pareto_frontier(p) == std::vector<int>{5, 0, 1, 4});
  CHECK(cd::pareto_frontier({}).empty());
}

TEST_CASE("budget: most accurate within the model's latency budget equals brute force (max and sum)") {
  std::mt19937 rng(7);
  int feasible = 0, binding = 0, ties = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const auto layers = random_layers(rng, 1 + trial % 4, 6);
    double fastest = 0, slowest = 0;
    for (const auto& l : layers) {
      double lo = 1e9, hi = 0;
      for (const auto& p : l.points) lo = std::min(lo, p.latency), hi = std::max(hi, p.latency);
      fastest += lo, slowest += hi;
    }
    const double budget = fastest + (slowest - fastest) * ((trial % 7) / 6.0) - (trial % 11 == 0 ? 1e-6 : 0);
    for (auto kind : {cd::ModelError::kMax, cd::ModelError::kSum}) {
      CAPTURE(trial);
      CAPTURE(static_cast<int>(kind));
      const auto got = cd::most_accurate_within(layers, budget, 0.0, kind);
      const double inf = std::numeric_limits<double>::infinity();
      const auto least = brute_force(layers, kind, budget, inf, [](const Best& a, const Best& b) {
        if (a.model_error != b.model_error) return a.model_error < b.model_error;
        if (a.error_sum != b.error_sum) return a.error_sum < b.error_sum;
        return a.latency < b.latency;
      });
      // kMax: every choice within kMaxErrorTie of the least model error is
      // its equal; the least sum of errors, then the least latency, decides.
      const auto want = kind == cd::ModelError::kSum || !least.feasible
                            ? least
                            : brute_force(layers, kind, budget, least.model_error * (1 + cd::kMaxErrorTie),
                                          [](const Best& a, const Best& b) {
                                            if (a.error_sum != b.error_sum) return a.error_sum < b.error_sum;
                                            return a.latency < b.latency;
                                          });
      ties += want.model_error > least.model_error;
      REQUIRE(got.feasible == want.feasible);
      if (!want.feasible) continue;
      ++feasible;
      REQUIRE(got.choice.size() == layers.size());
      CHECK(got.latency <= budget);
      CHECK_FALSE(got.within_noise);
      CHECK(got.model_error == doctest::Approx(want.model_error).epsilon(1e-12));
      CHECK(sum_errors(layers, got.choice) == doctest::Approx(want.error_sum).epsilon(1e-12));
      CHECK(got.latency == doctest::Approx(want.latency).epsilon(1e-12));
      CHECK(got.model_error == doctest::Approx(cd::model_error(layers, got.choice, kind)));
      // The budget binds: the most accurate choice overall is slower.
      const auto free = brute_force(layers, kind, 1e9, 1e9, [](const Best& a, const Best& b) {
        return a.model_error != b.model_error ? a.model_error < b.model_error : a.latency < b.latency;
      });
      binding += free.model_error < want.model_error;
    }
  }
  CHECK(feasible > 300);  // the cases are not all infeasible
  CHECK(binding > 100);   // nor all unconstrained
  CHECK(ties > 0);        // and the tolerance decided some of them
}

TEST_CASE("budget: a largest error lower by less than kMaxErrorTie does not buy a much worse layer") {
  // The recorded WordNet text case: layer 1 has 0.215 (slower) or 0.216
  // (faster); with 0.215, only layer 0's 0.185 fits the budget, with 0.216
  // its 0.094 does. Strictly the largest error prefers 0.215; within the
  // tolerance the sum decides.
  std::vector<cd::BudgetLayer> layers(2);
  layers[0].points = {{0.094, 1.00}, {0.185, 0.90}};
  layers[1].points = {{0.215, 1.05}, {0.216, 0.95}};
  const auto c = cd::most_accurate_within(layers, 1.96, 0.0, cd::ModelError::kMax);
  REQUIRE(c.feasible);
  CHECK(c.choice == std::vector<int>{0, 1});
  CHECK(c.model_error == doctest::Approx(0.216));
  // A largest error more than kMaxErrorTie higher is not a tie.
  layers[1].points[1].error = 0.215 * (1 + 2 * cd::kMaxErrorTie);
  CHECK(cd::most_accurate_within(layers, 1.96, 0.0, cd::ModelError::kMax).choice == std::vector<int>{1, 0});
}

TEST_CASE("budget: fastest within the model's error target equals brute force (max and sum)") {
  std::mt19937 rng(11);
  int feasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const auto layers = random_layers(rng, 1 + trial % 4, 6);
    for (auto kind : {cd::ModelError::kMax, cd::ModelError::kSum}) {
      const double target = (kind == cd::ModelError::kMax ? 0.1 : 0.25) * (1 + trial % 5);
      CAPTURE(trial);
      CAPTURE(static_cast<int>(kind));
      const auto got = cd::fastest_within_error(layers, target, kind);
      const auto want = brute_force(layers, kind, 1e9, target, [](const Best& a, const Best& b) {
        return a.latency != b.latency ? a.latency < b.latency : a.model_error < b.model_error;
      });
      REQUIRE(got.feasible == want.feasible);
      if (!want.feasible) continue;
      ++feasible;
      CHECK(got.model_error <= target);
      CHECK(got.latency == doctest::Approx(want.latency).epsilon(1e-12));
    }
  }
  CHECK(feasible > 300);
}

TEST_CASE("budget: a choice within the noise margin above the budget is taken and flagged") {
  // Layer 0: an accurate operator 2% over the budget's share, or a coarse one.
  std::vector<cd::BudgetLayer> layers(2);
  layers[0].points = {{0.07, 0.920}, {0.21, 0.770}};
  layers[1].points = {{0.05, 1.000}};
  const double budget = 1.900;  // 0.920 + 1.000 = 1.920: 1.05% over
  const auto strict = cd::most_accurate_within(layers, budget, 0.0, cd::ModelError::kMax);
  REQUIRE(strict.feasible);
  CHECK(strict.choice == std::vector<int>{1, 0});
  CHECK_FALSE(strict.within_noise);
  const auto noisy = cd::most_accurate_within(layers, budget, 0.02, cd::ModelError::kMax);
  REQUIRE(noisy.feasible);
  CHECK(noisy.choice == std::vector<int>{0, 0});
  CHECK(noisy.within_noise);
  // Outside the margin the coarse operator stays.
  CHECK(cd::most_accurate_within(layers, budget, 0.005, cd::ModelError::kMax).choice == std::vector<int>{1, 0});
  // Nothing fits: infeasible, no choice.
  const auto none = cd::most_accurate_within(layers, 1.0, 0.02, cd::ModelError::kMax);
  CHECK_FALSE(none.feasible);
  CHECK(none.choice.empty());
}

TEST_CASE("budget: the error is spent on the layer where it costs least (normalized errors)") {
  // Layer 0 is hard (its Sinkhorn T' = 1 error is 0.6), layer 1 easy (0.2).
  // Raw errors would give layer 0 the accurate map; normalized, layer 1's
  // 0.08 is the model's worst (0.4) and gets the budget.
  std::vector<cd::BudgetLayer> layers(2);
  layers[0].error_scale = 0.6;
  layers[0].points = {{0.12, 1.0}, {0.06, 1.3}};
  layers[1].error_scale = 0.2;
  layers[1].points = {{0.08, 1.0}, {0.03, 1.3}};
  const auto c = cd::most_accurate_within(layers, 2.35, 0.0, cd::ModelError::kMax);
  REQUIRE(c.feasible);
  CHECK(c.choice == std::vector<int>{0, 1});
  CHECK(c.model_error == doctest::Approx(0.2));
  // Weighting layer 0 three times turns the choice around.
  layers[0].weight = 3;
  CHECK(cd::most_accurate_within(layers, 2.35, 0.0, cd::ModelError::kMax).choice == std::vector<int>{1, 0});
}
