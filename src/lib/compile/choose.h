// The choice phase of compile: which operator a layer stores, given each
// candidate's held-out attention error and latencies asked of a
// LatencyModel lazily (only for candidates whose error could make them
// win). Pure apart from the model, so tests drive it with known latencies.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "asap/compile.h"
#include "asap/compile_record.h"
#include "asap/spec.h"
#include "compile/budget.h"

namespace asap {
namespace compile_detail {

struct OperatorCandidate {
  OperatorConfig op;
  int fit = -1;            // kAsap: index of its fit; -1 otherwise
  std::string name;        // for messages: "teacher", "sinkhorn T'=3", "slices+alpha/per-head@L16 k=1"
  double error = 0;        // held-out attention relative error (teacher: 0)
  bool selectable = true;  // false: reported and timed for reference, never chosen
  double latency = -1;     // seconds per call at the deployment shape (-1: not measured)
};

struct ChoiceOptions {
  Objective objective = Objective::kMinSpeedup;
  double min_speedup = 1.25;
  double max_error = -1;
  int pass_budget = 0;     // kFidelity
  int fixed_closures = 0;  // > 0: ASAP candidates only with this k
  int chunk = 6;           // candidates timed per LatencyModel call (besides the teacher)
  // --no-zero-parameter: only ASAP maps are selectable; when none meets the
  // objective's bar, the choice throws one sentence naming the bar instead
  // of storing a map that misses it (or the teacher).
  bool parametric_only = false;
  // --zero-parameter fallback, under kMinSpeedup: ASAP maps first. The
  // zero-parameter operators (plain Sinkhorn, the teacher) are stored only
  // when no map meets the budget, or when they are kZeroParameterGain times
  // closer to the teacher (errors floored at kNoiseErrorFloor) than the most
  // accurate map that meets it; under --budget model, the same for the
  // model's error against the best assignment of maps.
  bool maps_first = false;
  // kMinSpeedup: when the chosen operator's error over the layer's plain
  // softmax error (error_scale) is above `guard` (> 0), the fastest
  // operator within it replaces it (--guard under --budget layer;
  // choose_for_model guards the model's error with ModelChoiceOptions::guard,
  // and sets this from it when it falls back to each layer). 0: off.
  double guard = 0;
};

struct Choice {
  int index = -1;              // into the candidates
  int unguarded = -1;          // the budget's choice, when the guard replaced it
  int passed_over = -1;        // maps first: the zero-parameter operator the map was stored in place of
  bool target_met = false;     // the objective's requirement holds (else a stated fallback)
  std::string decision;        // one sentence for the user
  double teacher_latency = 0;  // seconds
  int latency_calls = 0;       // LatencyModel::measure calls
  // The latency table and the decision, as the layer record keeps them.
  LatencyChoiceRecord record(const std::vector<OperatorCandidate>& c) const;
};

// Times candidates through a LatencyModel, each call with the teacher
// (candidates[0]); latencies relative to the teacher's first measurement
// (t0), so that drift between calls cancels.
class Timer {
 public:
  Timer(std::vector<OperatorCandidate>& c, const LayerSpec& s, LatencyModel& m) : c_(c), s_(s), m_(m) {}
  void time(const std::vector<int>& which);
  // Times i again against the teacher; its latency becomes the slower of
  // the two relative measurements, so that a winner meets the target twice
  // (a choice right at the target otherwise fails it in half the reruns).
  void confirm(int i);
  double t0() const { return t0_; }
  int calls() const { return calls_; }

 private:
  std::vector<OperatorCandidate>& c_;
  const LayerSpec& s_;
  LatencyModel& m_;
  double t0_ = -1;
  int calls_ = 0;
};

// Relative tolerance under which two errors or latencies are a tie. A
// 1-process and a multi-process compile run the held-out examples in other
// batches through the float32 kernels and sum them in another order: their
// errors differ by up to about 2e-7 relative (the bundled teacher), and
// they must choose alike. Held-out errors from at most 64 examples do not
// tell apart operators this close anyway.
constexpr double kTieRel = 1e-6;
// Maps first (ChoiceOptions::maps_first): how much closer to the teacher
// plain Sinkhorn or the teacher must bring a layer (or the model) to be
// stored in place of the ASAP maps that meet the same budget.
constexpr double kZeroParameterGain = 2.0;
// An attention error below this counts as this where two choices' errors
// are compared as ratios (the noise margin, maps first): "twice as far"
// from an error of 0 (the teacher itself) or of a few hundredths is not a
// gain worth the budget (docs/decisions.md, "One budget for the model").
constexpr double kNoiseErrorFloor = 0.03;
bool close_to(double a, double b);
// What a layer's error is divided by: its error for Sinkhorn T' = 1 (plain
// softmax), so that an easy and a hard layer compare; 1 when that is not
// a positive finite number.
double error_scale(const std::vector<OperatorCandidate>& c);
// Whether the options let the choice store c (selectable; --closures).
bool allowed(const OperatorCandidate& c, const ChoiceOptions& o);
// The most accurate Sinkhorn (or teacher) with latency <= lat: index, or -1.
int best_sinkhorn_within(const std::vector<OperatorCandidate>& c, double lat);
std::string fmt(double x, int digits = 3);  // "%.*g"
std::string times(double x);                // "1.25x"

// candidates[0] must be the teacher, followed by Sinkhorn T' = 1..T-1 (all
// timed up front: the speed reference and the bounds), then ASAP
// candidates. Fills in the latencies it measures. Every latency is rescaled
// to the teacher's first measurement by the teacher timed in the same call.
Choice choose_operator(std::vector<OperatorCandidate>& candidates, const LayerSpec& s, const ChoiceOptions& opt,
                       LatencyModel& latency);

// ---- one budget for the model (model_choice.cpp) -------------------------
// One compiled layer as the model-level choice sees it: its candidates (as
// choose_operator takes them), the model that times them and its weight.
struct ModelLayer {
  const LayerSpec* spec = nullptr;
  std::vector<OperatorCandidate>* cands = nullptr;
  LatencyModel* latency = nullptr;
  double weight = 1;  // --layer-weights
};

struct ModelChoiceOptions {
  ModelErrorKind error = ModelErrorKind::kAuto;  // resolved by the objective (resolve_model_error)
  // The relative margin by which the model may exceed its latency budget
  // and count as meeting it: given (>= 0), or measured (< 0) as the spread
  // of repeated timings of the frontier operators, within [floor, cap].
  double noise = -1;
  double noise_floor = 0.02, noise_cap = 0.10;
  // Under Objective::kMinSpeedup: when the budget's choice has a model error
  // above `guard` (> 0), the fastest choice whose model error is at most
  // `guard` replaces it (the teacher, error 0, always is one), and the record
  // keeps what the budget would have stored. 0: no guard.
  double guard = 0.25;
};

struct ModelChoice {
  std::vector<Choice> layers;  // per layer, as choose_operator returns it
  ModelBudgetRecord record;
  bool per_layer_fallback = false;  // no choice met the model's objective: each layer chose on its own
};

// Under Objective::kMinSpeedup, the assignment of least model error whose
// summed latency is within the teachers' sum / min_speedup; one that needs
// the noise margin to fit replaces it only when its model error is at most
// half (or nothing fits the budget itself); under kMaxError, the fastest whose model error (weighted,
// not normalized: --max-error keeps its unit) is at most max_error. Times
// every allowed operator of every layer (once per latency key). When no
// assignment meets the objective, each layer falls back to
// choose_operator's rule. The layers' latency models must stay alive.
ModelChoice choose_for_model(std::vector<ModelLayer>& layers, const ChoiceOptions& o, const ModelChoiceOptions& mo);

// The model record of choices made layer by layer (--budget layer): the
// stored operators' summed latency and the model error they give.
ModelBudgetRecord per_layer_model_record(const std::vector<ModelLayer>& layers, const std::vector<Choice>& choices,
                                         const ChoiceOptions& o, ModelErrorKind error);

}  // namespace compile_detail
}  // namespace asap
