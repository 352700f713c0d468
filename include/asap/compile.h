// asap/compile.h -- the compile pipeline behind `asapc compile`.
//
// Per layer, the phases of src/lib/compile/ (compile.cpp reads as the list):
//   statistics  stream the calibration file in bounded batches: projections,
//               finite teacher, closure-ready dual, feature columns, per-head
//               LS sufficient statistics on a train / held-out split;
//   fits        per feature family, pooling and slice prefix, the ridge with
//               the lowest held-out dual MSE (from statistics, no pass);
//   errors      held-out attention error of every candidate operator: each
//               fit with k closures, Sinkhorn with T' < T, the teacher;
//   latency     the fused operators timed on this machine at the deployment
//               shape (only candidates whose error could make them win);
//   choice      the objective (default: the most accurate operator at least
//               --min-speedup times faster than the teacher);
//   artifact    the chosen operator, its fit record and the latency table.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "asap/artifact.h"
#include "asap/compile_record.h"
#include "asap/spec.h"
#include "asap/types.h"

namespace asap {

class Communicator;

// One candidate operator: a feature family and whether coefficients are per head.
struct Candidate {
  // "slices", "slices+alpha", "slices+alpha+softmax", "slices+alpha+softmax+sinkhorn3"
  // (slice prefixes from 0), or "alpha", "alpha+softmax", "alpha+softmax+sinkhorn3" (no slices);
  // every family with alpha may end in "+stats" (the score_stats columns) or "+cstats"
  // (those and the centered_stats columns).
  std::string features;
  bool per_head = false;
};

// The candidate families of a compile that names none (each pooled and per head).
inline constexpr const char* kDefaultFeatureFamilies[] = {"slices",
                                                          "slices+alpha",
                                                          "slices+alpha+softmax",
                                                          "slices+alpha+softmax+sinkhorn3",
                                                          "slices+alpha+stats",
                                                          "slices+alpha+softmax+sinkhorn3+stats",
                                                          "slices+alpha+cstats",
                                                          "slices+alpha+softmax+sinkhorn3+cstats"};

// Whether `features` names a candidate family (slices, slices+alpha, ...,
// alpha+softmax+sinkhorn3, the alpha families optionally followed by +stats or +cstats):
// the one parser compile itself uses, for front ends that word their own error.
bool is_feature_family(const std::string& features);

// An operator compile can choose, as far as its latency is concerned
// (coefficients and pooling do not change the time).
struct OperatorConfig {
  OperatorKind kind = OperatorKind::kAsap;
  FeatureFamily family;  // kAsap
  int closures = 0;      // kAsap: k >= 1
  int steps = 0;         // kSinkhorn: T'; kTeacher: T
  // "teacher", "sinkhorn-3", "asap-L16+alpha+softmax-k1": the keys of a latency table.
  std::string key() const;
  // Log-sum-exp passes: T', T, or feature passes + k.
  int lse_passes() const;
};

// Where compile's latencies come from. The default measures the fused
// operators on this machine; tests and reproducible runs inject their own
// (e.g. a table read from a file, --latency-table).
class LatencyModel {
 public:
  virtual ~LatencyModel() = default;
  // Seconds per call of each operator on `layer`'s deployment batch. The
  // operators of one call are timed together (round-robin), so their ratios
  // are measured in the same run.
  virtual std::vector<double> measure(const LayerSpec& layer, const std::vector<OperatorConfig>& ops) = 0;
  // What the numbers describe (CPU, instruction set, threads, source).
  virtual nlohmann::json describe() const = 0;
};

// A latency table from a JSON file: {"layer name" or "*": {key: seconds}}
// (keys as OperatorConfig::key()). Throws asap::Error naming the file when
// it is unreadable, and the missing key when an operator is not listed.
std::shared_ptr<LatencyModel> latency_table_from_file(const std::string& path);

// What compile optimises (docs/decisions.md, "Choosing the operator").
enum class Objective {
  kMinSpeedup,  // most accurate operator with latency <= teacher / min_speedup
  kMaxError,    // fastest operator with held-out attention error <= max_error
  kFidelity,    // most accurate ASAP map within the log-sum-exp pass budget (the pre-latency behaviour)
};

// What the latency objective applies to (--budget; docs/decisions.md, "One
// budget for the model"): the model (the sum over the compiled layers of the
// stored operators' latencies against the teachers' sum, the error spent
// where it costs least) or each layer on its own.
enum class BudgetScope { kModel, kLayer };
const char* budget_name(BudgetScope b);             // "model", "layer"
BudgetScope parse_budget(const std::string& name);  // one sentence naming --budget when unknown

// How the layers' held-out errors make the model's (--model-error): the
// largest, or the sum, of each layer's weighted error normalized by the
// layer's Sinkhorn T' = 1 error. Auto (the default) is the sum under a speed
// budget and the largest under --objective max-error, whose bound holds on
// every layer (docs/decisions.md, "The sum of the layers' errors").
enum class ModelErrorKind { kAuto, kMax, kSum };
const char* model_error_name(ModelErrorKind k);                     // "auto", "max", "sum"
ModelErrorKind parse_model_error(const std::string& name);          // one sentence naming --model-error when unknown
ModelErrorKind resolve_model_error(ModelErrorKind k, Objective o);  // auto made max or sum

// Where plain Sinkhorn (T' < T) and the teacher stand in the speed budget's
// choice (--zero-parameter): only when no ASAP map (or assignment of maps,
// under --budget model) meets the budget, or when they bring the model (a
// layer, under --budget layer) at least twice as close to the teachers as
// the best maps do (fallback, the default); as equals of the maps (compete);
// never (never: --no-zero-parameter). Under --objective max-error they
// always compete (docs/decisions.md, "ASAP maps first").
enum class ZeroParameter { kFallback, kCompete, kNever };
const char* zero_parameter_name(ZeroParameter z);             // "fallback", "compete", "never"
ZeroParameter parse_zero_parameter(const std::string& name);  // one sentence naming --zero-parameter when unknown

// The largest slice bank compile accepts.
constexpr int64_t kMaxSliceBank = 4096;

// The coefficient fit (--fit): ridge least squares; convex forward KL; or
// LS, then refined by L-BFGS on the attention error after the operator's
// closures (kept only when held-out error improves).
enum class FitKind { kLs, kKl, kAttention };
const char* fit_name(FitKind f);             // "ls", "kl", "attention"
FitKind parse_fit(const std::string& name);  // one sentence naming --fit when unknown

// The dual the LS map predicts (--targets): the closure-ready f* (run with
// any k), the k-matched row dual after T - k half-steps (run with exactly k
// closures), or both as candidates (docs/decisions.md).
enum class Targets { kBoth, kClosureReady, kKMatched };
const char* targets_name(Targets t);             // "both", "closure-ready", "k-matched"
Targets parse_targets(const std::string& name);  // one sentence naming --targets when unknown

struct CompileOptions {
  int64_t slice_bank = 64;            // slices drawn and stored per layer
  std::vector<int64_t> slice_counts;  // nested prefixes tried; empty = {0, 1, 2, 4, ..., slice_bank}
  int64_t fixed_slices = 0;           // > 0: use exactly this many slices
  std::vector<Candidate> candidates;  // empty = the four slices+... families x {pooled, per head}
  Objective objective = Objective::kMinSpeedup;
  double min_speedup = 1.25;                           // kMinSpeedup: required speed-up over the teacher
  double max_error = -1;                               // kMaxError: attention error bound (> 0)
  BudgetScope budget = BudgetScope::kModel;            // --budget: the objective for the model or per layer
  ModelErrorKind model_error = ModelErrorKind::kAuto;  // --model-error (budget model)
  std::vector<double> layer_weights;                   // --layer-weights: one per compiled layer (empty: all 1)
  double latency_noise = -1;                           // --latency-noise: relative margin (< 0: measured)
  double guard = 0.25;                                 // --guard: bound on the budget's model error (0: off)
  int64_t deploy_batch = 16;                           // examples per call at which latency is measured
  std::shared_ptr<LatencyModel> latency;               // null: measure the fused operators here
  ZeroParameter zero_parameter{};                      // --zero-parameter (kFallback): Sinkhorn T' < T, teacher
  std::vector<double> ridge_grid;                      // empty = default_ridge_grid()
  double ridge = -1;                                   // >= 0: fixed LS ridge (no selection)
  int closures = 0;                                    // > 0: fixed default number of closures
  int max_passes = 0;                                  // kFidelity: budget of LSE passes (feature passes + closures);
                                                       // 0 = max(1, T - 2)
  int max_closures = 5;                                // closures evaluated on held-out data
  int64_t selection_examples = 64;                     // held-out examples that run closures in the selection (0 = all)
  int64_t batch_size = 16;                             // examples per streamed batch
  double heldout_fraction = 0.2;                       // share of examples kept out of the fit
  int64_t min_heldout = 8;                             // fewer held-out examples: no data-driven choice
  uint64_t seed = 1234;                                // slice bank and split
  int64_t max_examples = 0;                            // > 0: use only the first examples of the file
  std::vector<std::string> layers;                     // empty = every layer of the spec
  FitKind fit = FitKind::kAttention;                   // --fit
  Targets targets = Targets::kBoth;                    // --targets
  double kl_ridge = -1;                                // >= 0: fixed KL ridge
  int kl_max_iters = 20;                               // Newton iterations
  double kl_cache_mb = 512;                            // memory budget for caching KL (and attention refit) batches
  int attention_iters = 60;                            // L-BFGS iterations of --fit attention
  int attention_patience = 3;      // stop the refit after this many held-out checks without gain (0: never)
  bool float64 = false;            // run teacher and features in float64
  bool skip_bad_examples = false;  // exclude examples whose scores overflow (warning) instead of refusing
  // Set: this process is one rank of a distributed compile (asap/dist.h).
  // Every rank must call compile_teacher with the same options; each
  // streams its share, sums are reduced, rank 0 measures latency and
  // chooses, and every rank returns the same artifact.
  std::shared_ptr<Communicator> comm;
  // Threads the operators are timed with (--deploy-threads): the
  // deployment's. In a distributed compile rank 0 times while the others
  // wait. 0: the process's own.
  int latency_threads = 0;
  std::function<void(const ProgressEvent&)> progress;  // called from the compiling thread
  std::function<void(const std::string&)> warn;        // warnings (default: none)
};

struct CompileResult {
  Artifact artifact;       // each layer's fit_json is its record, serialized
  CompileSummary summary;  // per layer: choices, held-out errors, timings (asap/compile_record.h)
};

// Compiles every selected layer. Throws asap::Error on bad input.
CompileResult compile_teacher(const std::string& checkpoint_path, const std::string& spec_path,
                              const std::string& calib_path, const CompileOptions& opt);
// A calibration set of several files, numbered through in order (with
// opt.comm, each rank's own files: docs/distributed.md).
CompileResult compile_teacher(const std::string& checkpoint_path, const std::string& spec_path,
                              const std::vector<std::string>& calib_paths, const CompileOptions& opt);

// The options that change what compile produces, as JSON (the summary's
// "options" and the digest ranks compare at start-up).
nlohmann::json compile_options_json(const CompileOptions& opt);

// Whether calibration example `example` belongs to the held-out split of a
// compile with this seed and held-out fraction (the split compile used; its
// seed and fraction are recorded in each layer's fit record).
bool in_heldout_split(uint64_t seed, double heldout_fraction, int64_t example);

}  // namespace asap
