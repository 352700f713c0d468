// asap/verify.h -- the compiled operator against its teacher on held-out
// data (asap-math.md section 7). `asapc verify` and compile's own report
// both call verify(), so their metrics are the same computation.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "asap/artifact.h"
#include "asap/compile_record.h"
#include "asap/metrics.h"
#include "asap/types.h"

namespace asap {

class CalibFile;
class Communicator;
struct Checkpoint;

struct VerifyOptions {
  int max_closures = 5;             // ASAP with k = 1..max_closures
  bool reduced_budgets = true;      // Sinkhorn normalizers with T' = 1..T-1
  bool time = true;                 // measure latencies
  int warmup = 1, repeats = 0;      // latency: median of repeats after warm-up (0: about 50 ms per operator, 5-41)
  int64_t batch_size = 16;          // examples per batch (also the timed batch)
  int64_t max_examples = 0;         // > 0: only the first examples that pass the filter
  int64_t scatter_points = 1500;    // predicted vs teacher dual points kept for the plot
  bool float64 = false;             // compute in float64 (default: float32, as deployed)
  std::vector<std::string> layers;  // empty: every artifact layer
  std::function<bool(int64_t)> example_filter;  // which data examples to use (default: all)
  std::function<void(const ProgressEvent&)> progress;
  // Seconds for the latencies (default: the steady clock); tests pass their own.
  std::function<double()> clock;
  // Set: this process is one rank of a distributed verify (asap/dist.h):
  // each rank runs its share of the examples, sums are reduced, rank 0
  // times the operators; every rank returns the same metrics.
  std::shared_ptr<Communicator> comm;
};

struct OperatorResult {
  std::string kind;             // "teacher", "asap", "sinkhorn"
  int steps = 0;                // closures (asap) or budget T' (sinkhorn, teacher)
  int lse_passes = 0;           // log-sum-exp passes including the softmax feature
  bool is_default = false;      // the artifact's default operator
  bool teacher_ending = false;  // ends on the teacher's side
  FidelityMetrics metrics;
  double latency_s = -1;  // median seconds per timed batch (-1: not timed)
};

struct LayerVerification {
  std::string name;
  int T = 0;
  int default_closures = 0;      // ASAP layers; 0 when the layer stores Sinkhorn or the teacher
  std::string default_operator;  // CompiledLayer::describe() of the stored operator
  int64_t examples = 0;
  std::vector<OperatorResult> operators;  // teacher first, then asap k = 1.. (ASAP layers), then sinkhorn T' = 1..
  std::vector<double> per_head_attention_error;  // default operator, per head
  std::vector<double> dual_pred, dual_teacher;   // scatter sample (centered, cost coordinates)
  double fit_time_s = -1;
  double break_even_calls = -1;  // fit_time / (t_teacher - t_default), -1 when not faster
  nlohmann::json fit;            // the artifact's fit record, as stored (written back into verify's JSON)
  // The fit record as compile's LayerRecord; unset when the artifact's
  // fit_json is empty or not a complete compile record (another writer).
  std::optional<LayerRecord> record;
};

// The model as verify measured it: the sums over the layers of the
// teachers' and the default operators' latencies (the model budget's
// measure, docs/decisions.md), and the layer whose default operator is
// furthest from its teacher relative to plain softmax (Sinkhorn T' = 1).
struct ModelVerification {
  double teacher_latency_s = -1, latency_s = -1;  // -1: some layer not timed
  double speedup = -1;
  std::string worst_layer;
  double worst_error = -1;       // its default operator's attention error
  double worst_normalized = -1;  // over its Sinkhorn T' = 1 error
};

struct VerifyResult {
  std::string artifact, checkpoint, data;
  int64_t timed_batch = 0;
  std::vector<LayerVerification> layers;
  ModelVerification model() const;
  nlohmann::json to_json() const;
};

// Checks the artifact belongs to the checkpoint: digest (unless force),
// layer names and shapes. Throws asap::Error with one sentence.
void check_artifact_matches(const Artifact& art, const std::string& artifact_path, const Checkpoint& ck, bool force);

// Runs the comparison. The teacher is computed from the checkpoint's weights
// through the artifact's recorded conventions.
VerifyResult verify(const Artifact& art, const std::string& artifact_path, const Checkpoint& ck, const CalibFile& data,
                    const VerifyOptions& opt);

}  // namespace asap
