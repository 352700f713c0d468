// asap/compile_record.h -- what compile decided and why, as plain structs:
// per layer the statistics summary, the candidate fits, the held-out error
// and latency tables, the decision with its reason, the refit outcome and
// the phase times (LayerRecord); for a run, every layer's record plus the
// distributed record and totals (CompileSummary).
//
// compile (src/lib/compile/) fills them; the CLI's summary, compile report
// and verify table and the HTML report render from them. JSON is written
// only at the file edge: `asapc compile --json`, the artifact's fit record
// (CompiledLayer::fit_json) and verify's JSON, each by the one to_json of its
// struct below, and read back by the one from_json, which throws asap::Error
// naming the first field it needs that is missing or of the wrong type.
// Keys are written in nlohmann's (sorted) order, so the files stay
// byte-compatible with the inline JSON this replaces.
//
// Plain data and JSON only (implemented in src/lib/report/compile_record.cpp):
// the report renders these records, and everything above it may read them.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace asap {

// One candidate ASAP map (the "candidates" of a record): family, pooling,
// ridge, and its held-out errors at every k it was run with.
struct FitCandidateRecord {
  std::string candidate;    // "slices+alpha/per-head@L16", the fit's name
  std::string features;     // the --features name, e.g. "slices+alpha"
  std::string target;       // "closure-ready" or "k-matched"
  int target_closures = 0;  // k of a k-matched map; 0 otherwise
  std::string family;       // FeatureFamily::name()
  bool per_head = false;
  int64_t slices = 0;
  double ridge = 0;
  double heldout_dual_rmse = -1;                     // -1: no held-out data
  std::vector<double> heldout_attention_error_by_k;  // k = 1.. (NaN: not comparable)
  std::vector<int> lse_passes_by_k;                  // k = 1..
};

// One slice prefix tried for a candidate family (the "slice_selection").
struct SlicePrefixRecord {
  int64_t slices = 0;
  double ridge = 0;
  double heldout_dual_mse = -1;
  bool kept = false;
  // The ridge grid and its held-out MSEs, when the ridge was chosen on data.
  std::optional<std::vector<double>> ridge_grid, ridge_grid_mse;
};
struct SliceSelectionRecord {
  std::string candidate;  // "slices+alpha/pooled", "...->k3" for a k-matched target
  std::vector<SlicePrefixRecord> prefixes;
};

// One row of the latency table: a candidate operator, its held-out error and
// (when timed) its latency.
struct LatencyRowRecord {
  std::string op;    // JSON "operator": "teacher T=6", "sinkhorn T'=3", "slices/pooled@L1 k=1"
  std::string key;   // OperatorConfig::key(), the key of a latency table
  std::string kind;  // "teacher", "sinkhorn", "asap"
  int lse_passes = 0;
  double heldout_attention_error = 0;
  bool selectable = true;
  std::optional<double> latency_s;  // null: not timed (its error could not make it win)
  std::optional<double> speedup;    // the teacher's latency / latency_s, when timed
};
// The choice over the latency table.
struct LatencyChoiceRecord {
  std::string decision;
  bool target_met = false;
  double teacher_latency_s = 0;
  int latency_calls = 0;
  std::vector<LatencyRowRecord> operators;
};
struct LatencyRecord {
  nlohmann::json source;                      // LatencyModel::describe(): machine, threads, or the table's file
  std::optional<LatencyChoiceRecord> choice;  // null without a data-driven choice
};

// The operator the layer stores.
struct ChosenRecord {
  std::string op;           // JSON "operator": "asap", "sinkhorn", "teacher"
  std::string description;  // CompiledLayer::describe()
  int lse_passes = 0;
  double heldout_attention_error = -1;  // -1: no data-driven choice
  // kAsap only: the fit it runs.
  std::optional<std::string> candidate, target, family;
  std::optional<bool> per_head;
  std::optional<int64_t> slices;
  std::optional<double> ridge;
  std::optional<int> closures;
  std::optional<double> heldout_dual_rmse;
  std::optional<int> sinkhorn_steps;         // kSinkhorn only
  std::optional<double> latency_s, speedup;  // a data-driven choice only
  bool is_asap() const { return op == "asap"; }
};

struct ObjectiveRecord {
  std::string name;  // "min-speedup", "max-error", "fidelity"
  std::optional<double> min_speedup, max_error;
  std::optional<int> pass_budget;
};

// Seconds spent per phase of one layer (the record's "phase_times_s").
struct PhaseTimes {
  double read = 0, teacher = 0, features = 0, statistics = 0, solve = 0, selection = 0, latency = 0;
  double communication = 0;  // inside reductions over ranks (waiting for the slowest included)
};

// The --fit kl outcome: the Newton fit per ridge and the chosen one.
struct KlStepRecord {
  int iter = 0;
  double objective = 0, grad_norm = 0, newton_decrement = 0, step = 0;
};
struct KlRidgeRecord {
  double ridge = 0;
  double heldout_kl = -1;
  int64_t iterations = 0;
  bool converged = false;
  std::vector<KlStepRecord> history;
};
struct KlRefitRecord {
  std::vector<double> ridge_grid;
  bool ridge_fixed = false;
  double train_kl_ls = 0, heldout_kl_ls = -1;
  std::vector<KlRidgeRecord> per_ridge;
  double ridge = 0;
  int64_t iterations = 0;
  bool converged = false;
  double objective = 0, grad_norm = 0, newton_decrement = 0;
  double train_kl = 0, heldout_kl = -1;
  double cached_mb = 0;
  bool cached = false;
};
// The --fit attention outcome: L-BFGS on the attention error.
struct AttnStepRecord {
  int iter = 0;
  double train = 0;
  std::optional<double> step;     // absent at iteration 0
  std::optional<double> heldout;  // on the iterations that checked it
};
struct AttnRefitRecord {
  int closures = 0;
  int iterations = 0, best_iteration = 0;
  std::string stopped;  // why the iterations ended (empty in records written before it was kept)
  double train_objective_ls = 0, train_objective = 0;
  double heldout_objective_ls = -1, heldout_objective = -1;
  std::vector<AttnStepRecord> history;
  double cached_mb = 0;
};
// The refit of the chosen map (the record's "kl" or "attention_fit"): its
// diagnostics, and whether it kept its coefficients against LS on held-out data.
struct RefitRecord {
  std::string fit;      // "kl" or "attention"
  std::string skipped;  // non-empty: why the refit did not run (only this is recorded)
  std::optional<KlRefitRecord> kl;
  std::optional<AttnRefitRecord> attention;
  // The held-out comparison with the LS start (when there is held-out data).
  std::optional<double> heldout_attention_error_ls, heldout_attention_error_refit;
  std::optional<bool> fell_back_to_ls;
};

// The compile options that shaped this layer (the record's "options").
struct RecordOptions {
  int64_t slice_bank = 0;
  std::vector<int64_t> slice_counts;
  std::vector<double> ridge_grid;
  double fixed_ridge = -1;
  double heldout_fraction = 0;
  uint64_t seed = 0;
  int64_t batch_size = 0, deploy_batch = 0;
  int max_closures = 0;
  bool float64 = false;
};

// The model's side of the choice (docs/decisions.md, "One budget for the
// model"): every compiled layer's stored operator against its teacher, timed
// at the deployment shape. Present when every layer had a data-driven choice.
struct ModelBudgetRecord {
  std::string scope;  // "model" (one budget for the model) or "layer" (each layer on its own)
  std::string error;  // "max" or "sum" of the layers' normalized errors
  std::vector<std::string> layers;
  std::vector<double> weights;       // --layer-weights, per layer
  std::vector<double> error_scales;  // per layer: what its error is divided by (Sinkhorn T' = 1's error)
  std::vector<double> teacher_latency_s, latency_s;  // per layer
  double teacher_total_s = 0, total_s = 0;
  double speedup = 0;  // teacher_total_s / total_s
  std::optional<double> min_speedup, max_error;
  double model_error = 0;                // of the stored operators
  std::string worst_layer;               // the layer with the largest normalized error
  double noise_margin = 0;               // relative latency a choice may exceed the budget by
  std::optional<double> noise_measured;  // the spread of repeated timings (absent: given or a table)
  bool within_noise = false;             // the choice needs the margin
  bool target_met = false;
  std::optional<double> guard;  // --guard in force (absent: off, or not a speed budget)
  // Present when the guard replaced the budget's choice: that choice's model
  // error and speed-up.
  std::optional<double> unguarded_error, unguarded_speedup;
  // Under a speed budget: --zero-parameter ("fallback", "compete", "never");
  // under fallback with --budget model, which assignment was stored:
  // "maps" (the best of the ASAP maps alone), "no-maps-fit" (no assignment
  // of maps met the budget) or "loops-twice-as-close".
  std::optional<std::string> zero_parameter, maps_first;
};

// One layer's record: the compile summary's entry and the artifact's fit record.
struct LayerRecord {
  std::string layer;
  int T = 0;
  std::string ending;  // "column" (T even) or "row"
  int64_t examples = 0;
  std::vector<int64_t> examples_per_rank;
  std::vector<int64_t> excluded_examples;
  int64_t train_examples = 0, heldout_examples = 0, selection_examples = 0, rows_used = 0;
  bool data_driven_selection = false;
  std::vector<std::string> candidates_with_nan_error;
  ObjectiveRecord objective;
  int pass_budget = 0;
  std::string decision;
  bool target_met = false;
  ChosenRecord chosen;
  std::vector<FitCandidateRecord> candidates;
  std::vector<double> sinkhorn_heldout_attention_error;  // T' = 1..T-1
  std::vector<SliceSelectionRecord> slice_selection;
  LatencyRecord latency;
  std::string fit;  // "ls", "kl", "attention"
  double fit_time_s = 0, teacher_time_s = 0;
  PhaseTimes phase_times_s;
  RecordOptions options;
  std::optional<RefitRecord> refit;        // JSON "kl" or "attention_fit"
  std::optional<ModelBudgetRecord> model;  // JSON "model_budget"
  // The candidate named `name` (e.g. "slices/pooled"), or null.
  const FitCandidateRecord* find_candidate(const std::string& name) const;
};

// The distributed record of a run: world size, calibration bytes read, and
// with a process group its communication.
struct DistributedRecord {
  int world_size = 1;
  double calibration_bytes_read = 0;  // summed over ranks
  struct Group {
    double communication_s_rank0 = 0, communication_s_mean = 0;
    int64_t bytes_reduced = 0, reductions = 0;
  };
  std::optional<Group> group;  // set in a process group
};

// What `asapc compile --json` prints: every layer's record and the totals.
struct CompileSummary {
  std::string checkpoint, spec, calibration;
  std::vector<LayerRecord> layers;
  DistributedRecord distributed;
  std::optional<ModelBudgetRecord> model_budget;
  double total_time_s = 0;
  std::optional<std::string> artifact;  // set by the CLI once written
  struct ReportPaths {
    std::string html, json;
  };
  std::optional<ReportPaths> report;  // set by the CLI when it wrote one
};

// The one serializer and the one parser of each record. from_json throws
// asap::Error naming the missing (or mistyped) field, e.g.
// "compile record: 'chosen' has no field 'description'".
void to_json(nlohmann::json& j, const FitCandidateRecord& r);
void from_json(const nlohmann::json& j, FitCandidateRecord& r);
void to_json(nlohmann::json& j, const SlicePrefixRecord& r);
void from_json(const nlohmann::json& j, SlicePrefixRecord& r);
void to_json(nlohmann::json& j, const SliceSelectionRecord& r);
void from_json(const nlohmann::json& j, SliceSelectionRecord& r);
void to_json(nlohmann::json& j, const LatencyRowRecord& r);
void from_json(const nlohmann::json& j, LatencyRowRecord& r);
void to_json(nlohmann::json& j, const LatencyChoiceRecord& r);
void from_json(const nlohmann::json& j, LatencyChoiceRecord& r);
void to_json(nlohmann::json& j, const LatencyRecord& r);
void from_json(const nlohmann::json& j, LatencyRecord& r);
void to_json(nlohmann::json& j, const ChosenRecord& r);
void from_json(const nlohmann::json& j, ChosenRecord& r);
void to_json(nlohmann::json& j, const ObjectiveRecord& r);
void from_json(const nlohmann::json& j, ObjectiveRecord& r);
void to_json(nlohmann::json& j, const PhaseTimes& r);
void from_json(const nlohmann::json& j, PhaseTimes& r);
void to_json(nlohmann::json& j, const KlStepRecord& r);
void from_json(const nlohmann::json& j, KlStepRecord& r);
void to_json(nlohmann::json& j, const KlRidgeRecord& r);
void from_json(const nlohmann::json& j, KlRidgeRecord& r);
void to_json(nlohmann::json& j, const KlRefitRecord& r);
void from_json(const nlohmann::json& j, KlRefitRecord& r);
void to_json(nlohmann::json& j, const AttnStepRecord& r);
void from_json(const nlohmann::json& j, AttnStepRecord& r);
void to_json(nlohmann::json& j, const AttnRefitRecord& r);
void from_json(const nlohmann::json& j, AttnRefitRecord& r);
void to_json(nlohmann::json& j, const RefitRecord& r);  // the diagnostics object (under "kl" / "attention_fit")
void to_json(nlohmann::json& j, const RecordOptions& r);
void from_json(const nlohmann::json& j, RecordOptions& r);
void to_json(nlohmann::json& j, const ModelBudgetRecord& r);
void from_json(const nlohmann::json& j, ModelBudgetRecord& r);
void to_json(nlohmann::json& j, const LayerRecord& r);
void from_json(const nlohmann::json& j, LayerRecord& r);
void to_json(nlohmann::json& j, const DistributedRecord& r);
void from_json(const nlohmann::json& j, DistributedRecord& r);
void to_json(nlohmann::json& j, const CompileSummary& r);
void from_json(const nlohmann::json& j, CompileSummary& r);

// An artifact's fit record (CompiledLayer::fit_json) as the layer's record.
// Throws asap::Error when it is not JSON or a field is missing.
LayerRecord parse_fit_record(const std::string& fit_json);

}  // namespace asap
