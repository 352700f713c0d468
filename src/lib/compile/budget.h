// The model-level latency budget (docs/decisions.md, "One budget for the
// model"): which operator each layer stores so that the model, not each
// layer, meets the speed-up, with the error spent where it costs least.
//
// A multiple-choice knapsack over each layer's Pareto frontier (held-out
// error against measured latency), solved exactly: there are few layers and
// few frontier points. Pure functions of their inputs, no timing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace asap {
namespace compile_detail {

// One operator a layer can store: its held-out attention error and its
// measured latency (seconds per call at the deployment shape).
struct BudgetPoint {
  double error = 0;
  double latency = 0;
};

struct BudgetLayer {
  std::vector<BudgetPoint> points;
  // What the layer's error is divided by so that layers of different
  // difficulty compare (the default: the layer's error for Sinkhorn T' = 1;
  // > 0), and its weight (--layer-weights; > 0).
  double error_scale = 1;
  double weight = 1;
  double normalized(const BudgetPoint& p) const { return weight * p.error / error_scale; }
};

// How the layers' normalized errors make the model's error.
enum class ModelError {
  kMax,  // the largest over the layers (default)
  kSum,  // their sum
};

// Indices into `points` of the Pareto frontier: sorted by latency, each
// strictly more accurate than every faster one (ties: the lower index).
std::vector<int> pareto_frontier(const std::vector<BudgetPoint>& points);

struct BudgetChoice {
  bool feasible = false;
  std::vector<int> choice;  // per layer, an index into its points
  double latency = 0;       // sum over layers
  double model_error = 0;   // ModelError of the choice
  // The choice needs the noise margin: its latency is above the budget but
  // within budget * (1 + margin).
  bool within_noise = false;
};

// Under ModelError::kMax, model errors within this relative distance of the
// least one count as equal, and the least sum of normalized errors decides
// among them: held-out errors come from about a hundred examples, and a
// choice that lowers the largest layer's error by 0.5% while doubling
// another layer's is not the more accurate model (docs/decisions.md, "The
// largest error, within 5%").
constexpr double kMaxErrorTie = 0.05;

// The choice of least model error whose summed latency is at most
// budget * (1 + noise_margin); among equals (kMax: within kMaxErrorTie of
// the least), the least sum of normalized errors, then the least latency.
// Infeasible (feasible = false, choice empty) when even the fastest points
// exceed it.
BudgetChoice most_accurate_within(const std::vector<BudgetLayer>& layers, double budget, double noise_margin,
                                  ModelError kind);

// The fastest choice whose model error is at most `target`; among equals,
// the least model error. Infeasible when no choice reaches the target.
BudgetChoice fastest_within_error(const std::vector<BudgetLayer>& layers, double target, ModelError kind);

// The model error of a given choice (one index per layer).
double model_error(const std::vector<BudgetLayer>& layers, const std::vector<int>& choice, ModelError kind);

}  // namespace compile_detail
}  // namespace asap
