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
};

struct Choice {
  int index = -1;              // into the candidates
  bool target_met = false;     // the objective's requirement holds (else a stated fallback)
  std::string decision;        // one sentence for the user
  double teacher_latency = 0;  // seconds
  int latency_calls = 0;       // LatencyModel::measure calls
  // The latency table and the decision, as the layer record keeps them.
  LatencyChoiceRecord record(const std::vector<OperatorCandidate>& c) const;
};

// candidates[0] must be the teacher, followed by Sinkhorn T' = 1..T-1 (all
// timed up front: the speed reference and the bounds), then ASAP
// candidates. Fills in the latencies it measures. Every latency is rescaled
// to the teacher's first measurement by the teacher timed in the same call.
Choice choose_operator(std::vector<OperatorCandidate>& candidates, const LayerSpec& s, const ChoiceOptions& opt,
                       LatencyModel& latency);

}  // namespace compile_detail
}  // namespace asap
