// The model-level latency budget: an exact multiple-choice knapsack over
// the layers' Pareto frontiers (budget.h).
#include "compile/budget.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace asap {
namespace compile_detail {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A partial choice over the first layers.
struct State {
  double latency = 0;
  double error_sum = 0;
  std::vector<int> pick;
};

// The frontier points of every layer, as indices into its points, sorted by latency.
std::vector<std::vector<int>> frontiers(const std::vector<BudgetLayer>& layers) {
  std::vector<std::vector<int>> f;
  f.reserve(layers.size());
  for (const auto& l : layers) f.push_back(pareto_frontier(l.points));
  return f;
}

// Every choice over the frontiers (restricted to normalized error <= cap)
// that is not dominated in (latency, sum of normalized errors), with
// latency <= max_latency and sum <= max_sum; sorted by latency, sums
// strictly decreasing. Exact: a dominated partial choice never completes
// to a better one.
std::vector<State> pareto_choices(const std::vector<BudgetLayer>& layers, const std::vector<std::vector<int>>& front,
                                  double cap, double max_latency, double max_sum) {
  const size_t L = layers.size();
  // The least latency and the least error the remaining layers can add.
  std::vector<double> rest_lat(L + 1, 0), rest_err(L + 1, 0);
  for (size_t l = L; l-- > 0;) {
    double ml = kInf, me = kInf;
    for (int i : front[l]) {
      const BudgetPoint& p = layers[l].points[i];
      if (layers[l].normalized(p) > cap) continue;
      ml = std::min(ml, p.latency);
      me = std::min(me, layers[l].normalized(p));
    }
    rest_lat[l] = rest_lat[l + 1] + ml;
    rest_err[l] = rest_err[l + 1] + me;
  }
  std::vector<State> states(1);
  for (size_t l = 0; l < L; ++l) {
    std::vector<State> next;
    for (const State& s : states)
      for (int i : front[l]) {
        const BudgetPoint& p = layers[l].points[i];
        const double e = layers[l].normalized(p);
        if (e > cap) continue;
        State t{s.latency + p.latency, s.error_sum + e, s.pick};
        // (Pruning with slack: the bounds are summed in another order than
        // the states; the final states are checked exactly below.)
        if (t.latency + rest_lat[l + 1] > max_latency * (1 + 1e-9) ||
            t.error_sum + rest_err[l + 1] > max_sum * (1 + 1e-9))
          continue;
        t.pick.push_back(i);
        next.push_back(std::move(t));
      }
    std::stable_sort(next.begin(), next.end(), [](const State& a, const State& b) {
      return a.latency != b.latency ? a.latency < b.latency : a.error_sum < b.error_sum;
    });
    states.clear();
    for (auto& s : next)
      if (states.empty() || s.error_sum < states.back().error_sum) states.push_back(std::move(s));
  }
  std::vector<State> out;
  for (auto& s : states)
    if (s.latency <= max_latency && s.error_sum <= max_sum) out.push_back(std::move(s));
  return out;
}

BudgetChoice finish(const std::vector<BudgetLayer>& layers, const State& s, ModelError kind, double budget) {
  BudgetChoice c;
  c.feasible = true;
  c.choice = s.pick;
  c.latency = s.latency;
  c.model_error = model_error(layers, s.pick, kind);
  c.within_noise = s.latency > budget;
  return c;
}

// The distinct normalized errors of the frontier points, ascending.
std::vector<double> error_levels(const std::vector<BudgetLayer>& layers, const std::vector<std::vector<int>>& front) {
  std::vector<double> v;
  for (size_t l = 0; l < layers.size(); ++l)
    for (int i : front[l]) v.push_back(layers[l].normalized(layers[l].points[i]));
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

// Per layer, the fastest frontier point with normalized error <= cap (-1: none).
std::vector<int> fastest_under(const std::vector<BudgetLayer>& layers, const std::vector<std::vector<int>>& front,
                               double cap, double* latency) {
  std::vector<int> pick;
  *latency = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    int best = -1;
    for (int i : front[l])  // by latency: the first that qualifies
      if (layers[l].normalized(layers[l].points[i]) <= cap) {
        best = i;
        break;
      }
    if (best < 0) return {};
    pick.push_back(best);
    *latency += layers[l].points[best].latency;
  }
  return pick;
}

}  // namespace

std::vector<int> pareto_frontier(const std::vector<BudgetPoint>& points) {
  std::vector<int> idx(points.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
    const BudgetPoint &p = points[a], &q = points[b];
    return p.latency != q.latency ? p.latency < q.latency : p.error < q.error;
  });
  std::vector<int> out;
  double best = kInf;
  for (int i : idx)
    if (points[i].error < best) {
      out.push_back(i);
      best = points[i].error;
    }
  return out;
}

double model_error(const std::vector<BudgetLayer>& layers, const std::vector<int>& choice, ModelError kind) {
  double e = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const double x = layers[l].normalized(layers[l].points[choice[l]]);
    e = kind == ModelError::kMax ? std::max(e, x) : e + x;
  }
  return e;
}

BudgetChoice most_accurate_within(const std::vector<BudgetLayer>& layers, double budget, double noise_margin,
                                  ModelError kind) {
  const auto front = frontiers(layers);
  const double limit = budget * (1 + std::max(0.0, noise_margin));
  double cap = kInf;
  if (kind == ModelError::kMax) {
    // The least level at which every layer's fastest point under it fits:
    // the latency of that choice only falls as the level rises.
    bool found = false;
    for (double level : error_levels(layers, front)) {
      double lat = 0;
      if (!fastest_under(layers, front, level, &lat).empty() && lat <= limit) {
        cap = level * (1 + kMaxErrorTie);
        found = true;
        break;
      }
    }
    if (!found) return {};
  }
  // Within that level and kMaxErrorTie above it (kSum: everything), the
  // least sum of errors that fits.
  const auto states = pareto_choices(layers, front, cap, limit, kInf);
  if (states.empty()) return {};
  return finish(layers, states.back(), kind, budget);
}

BudgetChoice fastest_within_error(const std::vector<BudgetLayer>& layers, double target, ModelError kind) {
  const auto front = frontiers(layers);
  if (kind == ModelError::kMax) {
    // Each layer on its own: its fastest point under the target.
    double lat = 0;
    auto pick = fastest_under(layers, front, target, &lat);
    if (pick.empty()) return {};
    return finish(layers, State{lat, 0, pick}, kind, kInf);
  }
  const auto states = pareto_choices(layers, front, kInf, kInf, target);
  if (states.empty()) return {};
  return finish(layers, states.front(), kind, kInf);  // the fastest; sums decrease along the list
}

}  // namespace compile_detail
}  // namespace asap
