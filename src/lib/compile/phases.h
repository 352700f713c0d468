// The phases of compile_teacher (include/asap/compile.h lists them), one
// function each; compile.cpp strings them together per layer.
#pragma once
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "asap/artifact.h"
#include "asap/compile.h"
#include "asap/compile_record.h"
#include "asap/dist.h"
#include "asap/spec.h"
#include "asap/teacher.h"
#include "reference/fit.h"

namespace asap {

class LayerStream;

namespace compile_detail {

// Seconds spent per phase (the record's phase_times_s): asap::PhaseTimes
// of asap/compile_record.h.

// ---- statistics (statistics.cpp) ----------------------------------------
// The statistics of a k-matched target (docs/decisions.md): the teacher's
// row dual after T - k half-steps, which k closures turn into exactly the
// teacher's plan.
struct MatchedStats {
  int k = 0;
  LsStats train, held;
};
struct Statistics {
  LsStats train, held;  // the closure-ready target f* (any k)
  std::vector<MatchedStats> matched;
  int64_t n_held = 0;
  std::vector<int64_t> held_idx;  // calibration indices of the held-out examples, increasing
  // Examples whose teacher dual or features are not finite (scores that
  // overflow), excluded under --skip-bad-examples (else compile refuses
  // them); global indices, increasing, over every rank.
  std::vector<int64_t> excluded;
  bool usable(int64_t e) const { return !std::binary_search(excluded.begin(), excluded.end(), e); }
};
// What the statistics phase reads of compile's options.
struct StatisticsOptions {
  int64_t batch_size = 16;        // examples per streamed batch
  double heldout_fraction = 0.2;  // the held-out split (with seed)
  uint64_t seed = 1234;
  bool skip_bad_examples = false;  // exclude overflowing examples instead of refusing
  Communicator* comm = nullptr;    // sums reduced over ranks when set
  std::function<void(const ProgressEvent&)> progress;
};
StatisticsOptions statistics_options(const CompileOptions& opt);

// Each rank streams its share and the sums are reduced over ranks, so every
// rank ends with the statistics of all examples.
Statistics gather_statistics(const LayerStream& stream, const Shards& sh, const LayerSpec& s, const at::Tensor& theta,
                             const FeatureFamily& widest, const StatisticsOptions& opt,
                             const std::vector<int>& matched_k, PhaseTimes& times);
// The closure counts k that have a matched target: T - k a row-dual step
// (odd), 2 <= k <= max_closures, T - k >= 1.
std::vector<int> matched_closures(const LayerSpec& s, int max_closures, Targets targets);

// ---- fits (fits.cpp) ------------------------------------------------------
// The family named by --features at slice prefix L.
FeatureFamily family_of(const std::string& features, int64_t slices);
// Whether the family name has slice columns at all ("alpha..." ones do not).
bool family_has_slices(const std::string& features);

// One fitted ASAP map: family (with its slice prefix), pooling, ridge, coefficients.
struct Fit {
  Candidate cand;
  FeatureFamily family;
  std::vector<int64_t> cols;
  int target_k = 0;  // 0: the closure-ready target; else k-matched, run with exactly k closures
  double lambda = 0;
  double dual_mse = -1;  // held-out dual MSE (-1: no held-out data)
  at::Tensor coef;
  std::vector<double> error_by_k;  // held-out attention error, k = 1..size
  bool reference_map = false;      // the paper's map (slices/pooled), reported at every k
  std::string name() const;        // "slices+alpha/per-head@L16"
};
struct FitTable {
  std::vector<Fit> fits;
  std::vector<SliceSelectionRecord> slice_tables;  // per candidate: every prefix tried
  std::vector<std::string> nan_fits;               // candidate@prefix whose held-out dual error is NaN (not kept)
};
// What the fits phase reads of compile's options.
struct FitOptions {
  double ridge = -1;                 // >= 0: fixed ridge (no selection)
  Targets targets = Targets::kBoth;  // which duals the maps predict
};

// Per candidate family and pooling, the ridge of each slice prefix from
// held-out statistics; prefixes whose held-out dual MSE is not 1% below
// every smaller prefix's are dropped (more slices, more latency, no gain).
// Without held-out data: the full bank at ridge 1e-3.
FitTable fit_candidates(const Statistics& st, const FeatureFamily& widest, const std::vector<Candidate>& candidates,
                        const std::vector<int64_t>& slice_counts, const std::vector<double>& grid,
                        const FitOptions& opt, bool can_select);

// ---- held-out errors (errors.cpp) -----------------------------------------
// Fills every fit's error_by_k (k = 1..k_eval of that fit) and returns the
// reduced-budget Sinkhorn errors, T' = 1..T-1 (index T'-1), on at most
// opt.selection_examples held-out examples, on the fused kernels.
struct HeldoutErrors {
  std::vector<double> sinkhorn;  // T' = 1..T-1
  int64_t examples = 0;
};
// What the errors phase reads of compile's options.
struct ErrorOptions {
  int64_t batch_size = 16;
  int64_t selection_examples = 64;  // held-out examples that run closures (0 = all)
  Communicator* comm = nullptr;
  std::function<void(const ProgressEvent&)> progress;
};
ErrorOptions error_options(const CompileOptions& opt);

// Each rank runs its share of the selection examples; sums are reduced.
HeldoutErrors heldout_errors(const LayerStream& stream, const Shards& sh, const LayerSpec& s, const at::Tensor& theta,
                             const FeatureFamily& widest, const std::vector<int64_t>& held_idx, std::vector<Fit>& fits,
                             const std::vector<int>& k_eval, const ErrorOptions& opt);

// ---- latency (latency.cpp) ------------------------------------------------
// The measured model: the fused operators on `deploy` examples of the layer.
std::shared_ptr<LatencyModel> measured_latency(const LayerStream& stream, const LayerSpec& s, const at::Tensor& theta,
                                               const std::vector<int64_t>& examples, int64_t deploy_batch);
// CPU model, instruction set and threads of this machine.
nlohmann::json machine_description();

}  // namespace compile_detail
}  // namespace asap
