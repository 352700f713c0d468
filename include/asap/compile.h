// asap/compile.h -- the compile pipeline (issue: `asapc compile`).
//
// Per layer, streaming the calibration file in bounded batches:
// projections -> finite teacher -> closure-ready dual -> centered
// cost-coordinate target -> slice bank -> feature columns -> per-head LS
// sufficient statistics (train / held-out split by example). Ridge, slice
// count and feature family are chosen from held-out statistics (no second
// pass); the feature family, head pooling and default number of closures
// are then chosen by held-out attention error against the teacher, within a
// budget of log-sum-exp passes.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "asap/artifact.h"
#include "asap/spec.h"

namespace asap {

struct ProgressEvent {
  std::string layer;     // layer being compiled
  std::string phase;     // "statistics", "selection", "kl"
  int64_t done = 0;      // examples (or passes) done in this phase
  int64_t total = 0;
};

// One candidate operator: a feature family and whether coefficients are per head.
struct Candidate {
  std::string features;  // "slices", "slices+alpha", "slices+alpha+softmax"
  bool per_head = false;
};

struct CompileOptions {
  int64_t slice_bank = 64;                 // slices drawn and stored per layer
  std::vector<int64_t> slice_counts;       // nested prefixes tried; empty = {0, 1, 2, 4, ..., slice_bank}
  int64_t fixed_slices = 0;                // > 0: use exactly this many slices
  double slice_cost = 0;                   // pass-equivalents per slice counted in the budget:
                                           // 0 = slices free (default, fidelity first),
                                           // < 0 = default_slice_cost(n) (latency-aware)
  std::vector<Candidate> candidates;       // empty = the three feature sets x {pooled, per head}
  std::vector<double> ridge_grid;          // empty = default_ridge_grid()
  double ridge = -1;                       // >= 0: fixed LS ridge (no selection)
  int closures = 0;                        // > 0: fixed default number of closures
  int max_passes = 0;                      // budget of LSE passes (closures + 1 for the softmax feature);
                                           // 0 = max(1, T - 2)
  int max_closures = 5;                    // closures evaluated on held-out data
  int64_t selection_examples = 64;         // held-out examples that run closures in the selection (0 = all)
  int64_t batch_size = 16;                 // examples per streamed batch
  double heldout_fraction = 0.2;           // share of examples kept out of the fit
  int64_t min_heldout = 8;                 // fewer held-out examples: no data-driven choice
  uint64_t seed = 1234;                    // slice bank and split
  int64_t max_examples = 0;                // > 0: use only the first examples of the file
  std::vector<std::string> layers;         // empty = every layer of the spec
  std::string fit = "ls";                  // "ls" or "kl"
  double kl_ridge = -1;                    // >= 0: fixed KL ridge
  int kl_max_iters = 20;                   // Newton iterations
  double kl_cache_mb = 512;                // memory budget for caching KL features
  bool float64 = false;                    // run teacher and features in float64
  std::function<void(const ProgressEvent&)> progress;  // called from the compiling thread
  std::function<void(const std::string&)> warn;         // warnings (default: none)
};

struct CompileResult {
  Artifact artifact;
  nlohmann::json summary;  // per layer: choices, held-out errors, timings
};

// Compiles every selected layer. Throws asap::Error on bad input.
CompileResult compile_teacher(const std::string& checkpoint_path, const std::string& spec_path,
                              const std::string& calib_path, const CompileOptions& opt);

// Whether calibration example `example` belongs to the held-out split of a
// compile with this seed and held-out fraction (the split compile used; its
// seed and fraction are recorded in each layer's fit record).
bool in_heldout_split(uint64_t seed, double heldout_fraction, int64_t example);

// Budget of LSE passes of a candidate: closures + 1 if it uses the softmax feature.
int lse_passes(const FeatureFamily& f, int closures);

// Estimated cost of one slice in log-sum-exp pass-equivalents at sequence
// length n, 8 log2(n) / n: two sorts and a potential per slice against n^2
// exponentials per pass, fitted to the fused kernels on an AVX-512 Xeon
// (docs/performance.md).
double default_slice_cost(int64_t n);

}  // namespace asap
