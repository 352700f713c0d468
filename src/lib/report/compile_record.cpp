// The one serializer and parser of each compile record (asap/compile_record.h).
// Key names and number types match the JSON compile wrote inline before the
// records existed, so the files stay byte-compatible; nlohmann orders keys.
#include "asap/compile_record.h"

#include <cmath>
#include <limits>

#include "asap/error.h"

namespace asap {

using nlohmann::json;

namespace {

// The field `key` of the object `j` (`where` names it in messages).
const json& field(const json& j, const char* where, const char* key) {
  if (!j.is_object()) throw Error(str("compile record: ", where, " is not a JSON object"));
  auto it = j.find(key);
  if (it == j.end()) throw Error(str("compile record: ", where, " has no field '", key, "'"));
  return *it;
}

template <class T>
T get(const json& j, const char* where, const char* key) {
  const json& v = field(j, where, key);
  try {
    return v.get<T>();
  } catch (const json::exception&) {
    throw Error(str("compile record: ", where, " field '", key, "' has the wrong type (", v.type_name(), ")"));
  }
}

// A number that JSON may hold as null (NaN and infinities are written as null).
double number_or_nan(const json& v, const char* where, const char* key) {
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!v.is_number()) throw Error(str("compile record: ", where, " field '", key, "' is not a number"));
  return v.get<double>();
}
double num(const json& j, const char* where, const char* key) {
  return number_or_nan(field(j, where, key), where, key);
}
std::vector<double> nums(const json& j, const char* where, const char* key) {
  const json& a = field(j, where, key);
  if (!a.is_array()) throw Error(str("compile record: ", where, " field '", key, "' is not an array"));
  std::vector<double> v;
  for (const auto& x : a) v.push_back(number_or_nan(x, where, key));
  return v;
}
template <class T>
std::optional<T> maybe(const json& j, const char* where, const char* key) {
  if (!j.is_object() || !j.contains(key)) return std::nullopt;
  return get<T>(j, where, key);
}
std::optional<double> maybe_num(const json& j, const char* where, const char* key) {
  if (!j.is_object() || !j.contains(key)) return std::nullopt;
  return num(j, where, key);
}
template <class T>
std::vector<T> list(const json& j, const char* where, const char* key) {
  const json& a = field(j, where, key);
  if (!a.is_array()) throw Error(str("compile record: ", where, " field '", key, "' is not an array"));
  std::vector<T> v;
  for (const auto& x : a) v.push_back(x.get<T>());
  return v;
}
template <class T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

}  // namespace

void to_json(json& j, const FitCandidateRecord& r) {
  j = json{{"candidate", r.candidate},
           {"features", r.features},
           {"target", r.target},
           {"target_closures", r.target_closures},
           {"family", r.family},
           {"per_head", r.per_head},
           {"slices", r.slices},
           {"ridge", r.ridge},
           {"heldout_dual_rmse", r.heldout_dual_rmse},
           {"heldout_attention_error_by_k", r.heldout_attention_error_by_k},
           {"lse_passes_by_k", r.lse_passes_by_k}};
}
void from_json(const json& j, FitCandidateRecord& r) {
  const char* w = "a candidate fit";
  r.candidate = get<std::string>(j, w, "candidate");
  r.features = get<std::string>(j, w, "features");
  r.target = get<std::string>(j, w, "target");
  r.target_closures = get<int>(j, w, "target_closures");
  r.family = get<std::string>(j, w, "family");
  r.per_head = get<bool>(j, w, "per_head");
  r.slices = get<int64_t>(j, w, "slices");
  r.ridge = num(j, w, "ridge");
  r.heldout_dual_rmse = num(j, w, "heldout_dual_rmse");
  r.heldout_attention_error_by_k = nums(j, w, "heldout_attention_error_by_k");
  r.lse_passes_by_k = get<std::vector<int>>(j, w, "lse_passes_by_k");
}

void to_json(json& j, const SlicePrefixRecord& r) {
  j = json{{"slices", r.slices}, {"ridge", r.ridge}, {"heldout_dual_mse", r.heldout_dual_mse}, {"kept", r.kept}};
  put(j, "ridge_grid", r.ridge_grid);
  put(j, "ridge_grid_mse", r.ridge_grid_mse);
}
void from_json(const json& j, SlicePrefixRecord& r) {
  const char* w = "a slice prefix";
  r.slices = get<int64_t>(j, w, "slices");
  r.ridge = num(j, w, "ridge");
  r.heldout_dual_mse = num(j, w, "heldout_dual_mse");
  r.kept = get<bool>(j, w, "kept");
  r.ridge_grid.reset();
  r.ridge_grid_mse.reset();
  if (j.contains("ridge_grid")) r.ridge_grid = nums(j, w, "ridge_grid");
  if (j.contains("ridge_grid_mse")) r.ridge_grid_mse = nums(j, w, "ridge_grid_mse");
}

void to_json(json& j, const SliceSelectionRecord& r) { j = json{{"candidate", r.candidate}, {"prefixes", r.prefixes}}; }
void from_json(const json& j, SliceSelectionRecord& r) {
  r.candidate = get<std::string>(j, "a slice selection", "candidate");
  r.prefixes = list<SlicePrefixRecord>(j, "a slice selection", "prefixes");
}

void to_json(json& j, const LatencyRowRecord& r) {
  j = json{{"operator", r.op},
           {"key", r.key},
           {"kind", r.kind},
           {"lse_passes", r.lse_passes},
           {"heldout_attention_error", r.heldout_attention_error},
           {"selectable", r.selectable},
           {"latency_s", r.latency_s ? json(*r.latency_s) : json(nullptr)}};
  put(j, "speedup", r.speedup);
}
void from_json(const json& j, LatencyRowRecord& r) {
  const char* w = "a latency table row";
  r.op = get<std::string>(j, w, "operator");
  r.key = get<std::string>(j, w, "key");
  r.kind = get<std::string>(j, w, "kind");
  r.lse_passes = get<int>(j, w, "lse_passes");
  r.heldout_attention_error = num(j, w, "heldout_attention_error");
  r.selectable = get<bool>(j, w, "selectable");
  const json& lat = field(j, w, "latency_s");
  r.latency_s = lat.is_null() ? std::nullopt : std::optional<double>(num(j, w, "latency_s"));
  r.speedup = maybe_num(j, w, "speedup");
}

void to_json(json& j, const LatencyChoiceRecord& r) {
  j = json{{"decision", r.decision},
           {"target_met", r.target_met},
           {"teacher_latency_s", r.teacher_latency_s},
           {"latency_calls", r.latency_calls},
           {"operators", r.operators}};
}
void from_json(const json& j, LatencyChoiceRecord& r) {
  const char* w = "'latency.choice'";
  r.decision = get<std::string>(j, w, "decision");
  r.target_met = get<bool>(j, w, "target_met");
  r.teacher_latency_s = num(j, w, "teacher_latency_s");
  r.latency_calls = get<int>(j, w, "latency_calls");
  r.operators = list<LatencyRowRecord>(j, w, "operators");
}

void to_json(json& j, const LatencyRecord& r) {
  j = json{{"source", r.source}, {"choice", r.choice ? json(*r.choice) : json()}};
}
void from_json(const json& j, LatencyRecord& r) {
  r.source = field(j, "'latency'", "source");
  const json& c = field(j, "'latency'", "choice");
  r.choice = c.is_null() ? std::nullopt : std::optional<LatencyChoiceRecord>(c.get<LatencyChoiceRecord>());
}

void to_json(json& j, const ChosenRecord& r) {
  j = json{{"operator", r.op},
           {"description", r.description},
           {"lse_passes", r.lse_passes},
           {"heldout_attention_error", r.heldout_attention_error}};
  put(j, "candidate", r.candidate);
  put(j, "target", r.target);
  put(j, "family", r.family);
  put(j, "per_head", r.per_head);
  put(j, "slices", r.slices);
  put(j, "ridge", r.ridge);
  put(j, "closures", r.closures);
  put(j, "heldout_dual_rmse", r.heldout_dual_rmse);
  put(j, "sinkhorn_steps", r.sinkhorn_steps);
  put(j, "latency_s", r.latency_s);
  put(j, "speedup", r.speedup);
}
void from_json(const json& j, ChosenRecord& r) {
  const char* w = "'chosen'";
  r.op = get<std::string>(j, w, "operator");
  r.description = get<std::string>(j, w, "description");
  r.lse_passes = get<int>(j, w, "lse_passes");
  r.heldout_attention_error = num(j, w, "heldout_attention_error");
  if (r.is_asap()) {  // what the reports show of an ASAP map must be there
    r.candidate = get<std::string>(j, w, "candidate");
    r.target = get<std::string>(j, w, "target");
    r.family = get<std::string>(j, w, "family");
    r.per_head = get<bool>(j, w, "per_head");
    r.slices = get<int64_t>(j, w, "slices");
    r.ridge = num(j, w, "ridge");
    r.closures = get<int>(j, w, "closures");
    r.heldout_dual_rmse = num(j, w, "heldout_dual_rmse");
  } else {
    r.candidate = maybe<std::string>(j, w, "candidate");
    r.target = maybe<std::string>(j, w, "target");
    r.family = maybe<std::string>(j, w, "family");
    r.per_head = maybe<bool>(j, w, "per_head");
    r.slices = maybe<int64_t>(j, w, "slices");
    r.ridge = maybe_num(j, w, "ridge");
    r.closures = maybe<int>(j, w, "closures");
    r.heldout_dual_rmse = maybe_num(j, w, "heldout_dual_rmse");
  }
  r.sinkhorn_steps =
      r.op == "sinkhorn" ? std::optional<int>(get<int>(j, w, "sinkhorn_steps")) : maybe<int>(j, w, "sinkhorn_steps");
  r.latency_s = maybe_num(j, w, "latency_s");
  r.speedup = maybe_num(j, w, "speedup");
}

void to_json(json& j, const ObjectiveRecord& r) {
  j = json{{"name", r.name}};
  put(j, "min_speedup", r.min_speedup);
  put(j, "max_error", r.max_error);
  put(j, "pass_budget", r.pass_budget);
}
void from_json(const json& j, ObjectiveRecord& r) {
  const char* w = "'objective'";
  r.name = get<std::string>(j, w, "name");
  r.min_speedup = maybe_num(j, w, "min_speedup");
  r.max_error = maybe_num(j, w, "max_error");
  r.pass_budget = maybe<int>(j, w, "pass_budget");
}

void to_json(json& j, const PhaseTimes& r) {
  j = json{
      {"read", r.read},   {"teacher", r.teacher},     {"features", r.features}, {"statistics", r.statistics},
      {"solve", r.solve}, {"selection", r.selection}, {"latency", r.latency},   {"communication", r.communication}};
}
void from_json(const json& j, PhaseTimes& r) {
  const char* w = "'phase_times_s'";
  r.read = num(j, w, "read");
  r.teacher = num(j, w, "teacher");
  r.features = num(j, w, "features");
  r.statistics = num(j, w, "statistics");
  r.solve = num(j, w, "solve");
  r.selection = num(j, w, "selection");
  r.latency = num(j, w, "latency");
  r.communication = num(j, w, "communication");
}

void to_json(json& j, const KlStepRecord& r) {
  j = json{{"iter", r.iter},
           {"objective", r.objective},
           {"grad_norm", r.grad_norm},
           {"newton_decrement", r.newton_decrement},
           {"step", r.step}};
}
void from_json(const json& j, KlStepRecord& r) {
  const char* w = "a KL iteration";
  r.iter = get<int>(j, w, "iter");
  r.objective = num(j, w, "objective");
  r.grad_norm = num(j, w, "grad_norm");
  r.newton_decrement = num(j, w, "newton_decrement");
  r.step = num(j, w, "step");
}

void to_json(json& j, const KlRidgeRecord& r) {
  j = json{{"ridge", r.ridge},
           {"heldout_kl", r.heldout_kl},
           {"iterations", r.iterations},
           {"converged", r.converged},
           {"history", r.history}};
}
void from_json(const json& j, KlRidgeRecord& r) {
  const char* w = "a KL ridge";
  r.ridge = num(j, w, "ridge");
  r.heldout_kl = num(j, w, "heldout_kl");
  r.iterations = get<int64_t>(j, w, "iterations");
  r.converged = get<bool>(j, w, "converged");
  r.history = list<KlStepRecord>(j, w, "history");
}

void to_json(json& j, const KlRefitRecord& r) {
  j = json{{"ridge_grid", r.ridge_grid},
           {"ridge_fixed", r.ridge_fixed},
           {"train_kl_ls", r.train_kl_ls},
           {"heldout_kl_ls", r.heldout_kl_ls},
           {"per_ridge", r.per_ridge},
           {"ridge", r.ridge},
           {"iterations", r.iterations},
           {"converged", r.converged},
           {"objective", r.objective},
           {"grad_norm", r.grad_norm},
           {"newton_decrement", r.newton_decrement},
           {"train_kl", r.train_kl},
           {"heldout_kl", r.heldout_kl},
           {"cached_mb", r.cached_mb},
           {"cached", r.cached}};
}
void from_json(const json& j, KlRefitRecord& r) {
  const char* w = "'kl'";
  r.ridge_grid = nums(j, w, "ridge_grid");
  r.ridge_fixed = get<bool>(j, w, "ridge_fixed");
  r.train_kl_ls = num(j, w, "train_kl_ls");
  r.heldout_kl_ls = num(j, w, "heldout_kl_ls");
  r.per_ridge = list<KlRidgeRecord>(j, w, "per_ridge");
  r.ridge = num(j, w, "ridge");
  r.iterations = get<int64_t>(j, w, "iterations");
  r.converged = get<bool>(j, w, "converged");
  r.objective = num(j, w, "objective");
  r.grad_norm = num(j, w, "grad_norm");
  r.newton_decrement = num(j, w, "newton_decrement");
  r.train_kl = num(j, w, "train_kl");
  r.heldout_kl = num(j, w, "heldout_kl");
  r.cached_mb = num(j, w, "cached_mb");
  r.cached = get<bool>(j, w, "cached");
}

void to_json(json& j, const AttnStepRecord& r) {
  j = json{{"iter", r.iter}, {"train", r.train}};
  put(j, "step", r.step);
  put(j, "heldout", r.heldout);
}
void from_json(const json& j, AttnStepRecord& r) {
  const char* w = "an attention refit iteration";
  r.iter = get<int>(j, w, "iter");
  r.train = num(j, w, "train");
  r.step = maybe_num(j, w, "step");
  r.heldout = maybe_num(j, w, "heldout");
}

void to_json(json& j, const AttnRefitRecord& r) {
  j = json{{"closures", r.closures},
           {"iterations", r.iterations},
           {"best_iteration", r.best_iteration},
           {"stopped", r.stopped},
           {"train_objective_ls", r.train_objective_ls},
           {"train_objective", r.train_objective},
           {"heldout_objective_ls", r.heldout_objective_ls},
           {"heldout_objective", r.heldout_objective},
           {"history", r.history},
           {"cached_mb", r.cached_mb}};
}
void from_json(const json& j, AttnRefitRecord& r) {
  const char* w = "'attention_fit'";
  r.closures = get<int>(j, w, "closures");
  r.iterations = get<int>(j, w, "iterations");
  r.best_iteration = get<int>(j, w, "best_iteration");
  r.stopped = j.contains("stopped") ? get<std::string>(j, w, "stopped") : std::string();
  r.train_objective_ls = num(j, w, "train_objective_ls");
  r.train_objective = num(j, w, "train_objective");
  r.heldout_objective_ls = num(j, w, "heldout_objective_ls");
  r.heldout_objective = num(j, w, "heldout_objective");
  r.history = list<AttnStepRecord>(j, w, "history");
  r.cached_mb = num(j, w, "cached_mb");
}

void to_json(json& j, const RefitRecord& r) {
  if (!r.skipped.empty()) {
    j = json{{"skipped", r.skipped}};
    return;
  }
  j = r.kl ? json(*r.kl) : r.attention ? json(*r.attention) : json::object();
  put(j, "heldout_attention_error_ls", r.heldout_attention_error_ls);
  put(j, r.fit == "kl" ? "heldout_attention_error_kl" : "heldout_attention_error_refit",
      r.heldout_attention_error_refit);
  put(j, "fell_back_to_ls", r.fell_back_to_ls);
}

namespace {
RefitRecord refit_from_json(const json& j, const std::string& fit) {
  RefitRecord r;
  r.fit = fit;
  const char* w = fit == "kl" ? "'kl'" : "'attention_fit'";
  if (j.is_object() && j.contains("skipped")) {
    r.skipped = get<std::string>(j, w, "skipped");
    return r;
  }
  if (fit == "kl")
    r.kl = j.get<KlRefitRecord>();
  else
    r.attention = j.get<AttnRefitRecord>();
  r.heldout_attention_error_ls = maybe_num(j, w, "heldout_attention_error_ls");
  r.heldout_attention_error_refit =
      maybe_num(j, w, fit == "kl" ? "heldout_attention_error_kl" : "heldout_attention_error_refit");
  r.fell_back_to_ls = maybe<bool>(j, w, "fell_back_to_ls");
  return r;
}
}  // namespace

void to_json(json& j, const RecordOptions& r) {
  j = json{{"slice_bank", r.slice_bank},   {"slice_counts", r.slice_counts},         {"ridge_grid", r.ridge_grid},
           {"fixed_ridge", r.fixed_ridge}, {"heldout_fraction", r.heldout_fraction}, {"seed", r.seed},
           {"batch_size", r.batch_size},   {"deploy_batch", r.deploy_batch},         {"max_closures", r.max_closures},
           {"float64", r.float64}};
}
void from_json(const json& j, RecordOptions& r) {
  const char* w = "'options'";
  r.slice_bank = get<int64_t>(j, w, "slice_bank");
  r.slice_counts = get<std::vector<int64_t>>(j, w, "slice_counts");
  r.ridge_grid = nums(j, w, "ridge_grid");
  r.fixed_ridge = num(j, w, "fixed_ridge");
  r.heldout_fraction = num(j, w, "heldout_fraction");
  r.seed = get<uint64_t>(j, w, "seed");
  r.batch_size = get<int64_t>(j, w, "batch_size");
  r.deploy_batch = get<int64_t>(j, w, "deploy_batch");
  r.max_closures = get<int>(j, w, "max_closures");
  r.float64 = get<bool>(j, w, "float64");
}

void to_json(json& j, const ModelBudgetRecord& r) {
  j = json{{"scope", r.scope},
           {"error", r.error},
           {"layers", r.layers},
           {"weights", r.weights},
           {"error_scales", r.error_scales},
           {"teacher_latency_s", r.teacher_latency_s},
           {"latency_s", r.latency_s},
           {"teacher_total_s", r.teacher_total_s},
           {"total_s", r.total_s},
           {"speedup", r.speedup},
           {"model_error", r.model_error},
           {"worst_layer", r.worst_layer},
           {"noise_margin", r.noise_margin},
           {"within_noise", r.within_noise},
           {"target_met", r.target_met}};
  put(j, "min_speedup", r.min_speedup);
  put(j, "max_error", r.max_error);
  put(j, "noise_measured", r.noise_measured);
  put(j, "guard", r.guard);
  put(j, "unguarded_error", r.unguarded_error);
  put(j, "unguarded_speedup", r.unguarded_speedup);
  put(j, "zero_parameter", r.zero_parameter);
  put(j, "maps_first", r.maps_first);
}
void from_json(const json& j, ModelBudgetRecord& r) {
  const char* w = "'model_budget'";
  r.scope = get<std::string>(j, w, "scope");
  r.error = get<std::string>(j, w, "error");
  r.layers = get<std::vector<std::string>>(j, w, "layers");
  r.weights = nums(j, w, "weights");
  r.error_scales = nums(j, w, "error_scales");
  r.teacher_latency_s = nums(j, w, "teacher_latency_s");
  r.latency_s = nums(j, w, "latency_s");
  r.teacher_total_s = num(j, w, "teacher_total_s");
  r.total_s = num(j, w, "total_s");
  r.speedup = num(j, w, "speedup");
  r.model_error = num(j, w, "model_error");
  r.worst_layer = get<std::string>(j, w, "worst_layer");
  r.noise_margin = num(j, w, "noise_margin");
  r.within_noise = get<bool>(j, w, "within_noise");
  r.target_met = get<bool>(j, w, "target_met");
  r.min_speedup = maybe_num(j, w, "min_speedup");
  r.max_error = maybe_num(j, w, "max_error");
  r.noise_measured = maybe_num(j, w, "noise_measured");
  r.guard = maybe_num(j, w, "guard");
  r.unguarded_error = maybe_num(j, w, "unguarded_error");
  r.unguarded_speedup = maybe_num(j, w, "unguarded_speedup");
  r.zero_parameter = maybe<std::string>(j, w, "zero_parameter");
  r.maps_first = maybe<std::string>(j, w, "maps_first");
}

const FitCandidateRecord* LayerRecord::find_candidate(const std::string& name) const {
  for (const auto& c : candidates)
    if (c.candidate == name) return &c;
  return nullptr;
}

void to_json(json& j, const LayerRecord& r) {
  j = json{{"layer", r.layer},
           {"T", r.T},
           {"ending", r.ending},
           {"examples", r.examples},
           {"examples_per_rank", r.examples_per_rank},
           {"excluded_examples", r.excluded_examples},
           {"train_examples", r.train_examples},
           {"heldout_examples", r.heldout_examples},
           {"selection_examples", r.selection_examples},
           {"rows_used", r.rows_used},
           {"data_driven_selection", r.data_driven_selection},
           {"candidates_with_nan_error", r.candidates_with_nan_error},
           {"objective", r.objective},
           {"pass_budget", r.pass_budget},
           {"decision", r.decision},
           {"target_met", r.target_met},
           {"chosen", r.chosen},
           {"candidates", r.candidates},
           {"sinkhorn_heldout_attention_error", r.sinkhorn_heldout_attention_error},
           {"slice_selection", r.slice_selection},
           {"latency", r.latency},
           {"fit", r.fit},
           {"fit_time_s", r.fit_time_s},
           {"teacher_time_s", r.teacher_time_s},
           {"phase_times_s", r.phase_times_s},
           {"options", r.options}};
  if (r.refit) j[r.refit->fit == "attention" ? "attention_fit" : "kl"] = *r.refit;
  if (r.model) j["model_budget"] = *r.model;
}
void from_json(const json& j, LayerRecord& r) {
  const char* w = "the layer record";
  r.layer = get<std::string>(j, w, "layer");
  r.T = get<int>(j, w, "T");
  r.ending = get<std::string>(j, w, "ending");
  r.examples = get<int64_t>(j, w, "examples");
  r.examples_per_rank = get<std::vector<int64_t>>(j, w, "examples_per_rank");
  r.excluded_examples = get<std::vector<int64_t>>(j, w, "excluded_examples");
  r.train_examples = get<int64_t>(j, w, "train_examples");
  r.heldout_examples = get<int64_t>(j, w, "heldout_examples");
  r.selection_examples = get<int64_t>(j, w, "selection_examples");
  r.rows_used = get<int64_t>(j, w, "rows_used");
  r.data_driven_selection = get<bool>(j, w, "data_driven_selection");
  r.candidates_with_nan_error = get<std::vector<std::string>>(j, w, "candidates_with_nan_error");
  r.objective = field(j, w, "objective").get<ObjectiveRecord>();
  r.pass_budget = get<int>(j, w, "pass_budget");
  r.decision = get<std::string>(j, w, "decision");
  r.target_met = get<bool>(j, w, "target_met");
  r.chosen = field(j, w, "chosen").get<ChosenRecord>();
  r.candidates = list<FitCandidateRecord>(j, w, "candidates");
  r.sinkhorn_heldout_attention_error = nums(j, w, "sinkhorn_heldout_attention_error");
  r.slice_selection = list<SliceSelectionRecord>(j, w, "slice_selection");
  r.latency = field(j, w, "latency").get<LatencyRecord>();
  r.fit = get<std::string>(j, w, "fit");
  r.fit_time_s = num(j, w, "fit_time_s");
  r.teacher_time_s = num(j, w, "teacher_time_s");
  r.phase_times_s = field(j, w, "phase_times_s").get<PhaseTimes>();
  r.options = field(j, w, "options").get<RecordOptions>();
  r.refit.reset();
  if (j.contains("kl"))
    r.refit = refit_from_json(j["kl"], "kl");
  else if (j.contains("attention_fit"))
    r.refit = refit_from_json(j["attention_fit"], "attention");
  r.model.reset();  // absent in artifacts of asapc before the model budget
  if (j.contains("model_budget")) r.model = j["model_budget"].get<ModelBudgetRecord>();
}

void to_json(json& j, const DistributedRecord& r) {
  j = json{{"world_size", r.world_size}};
  if (r.group) {  // summed over ranks as doubles
    j["calibration_bytes_read"] = r.calibration_bytes_read;
    j["communication_s_rank0"] = r.group->communication_s_rank0;
    j["communication_s_mean"] = r.group->communication_s_mean;
    j["bytes_reduced"] = r.group->bytes_reduced;
    j["reductions"] = r.group->reductions;
  } else {
    j["calibration_bytes_read"] = static_cast<int64_t>(r.calibration_bytes_read);
  }
}
void from_json(const json& j, DistributedRecord& r) {
  const char* w = "'distributed'";
  r.world_size = get<int>(j, w, "world_size");
  r.calibration_bytes_read = num(j, w, "calibration_bytes_read");
  r.group.reset();
  if (j.contains("communication_s_rank0")) {
    DistributedRecord::Group g;
    g.communication_s_rank0 = num(j, w, "communication_s_rank0");
    g.communication_s_mean = num(j, w, "communication_s_mean");
    g.bytes_reduced = get<int64_t>(j, w, "bytes_reduced");
    g.reductions = get<int64_t>(j, w, "reductions");
    r.group = g;
  }
}

void to_json(json& j, const CompileSummary& r) {
  j = json{{"checkpoint", r.checkpoint},   {"spec", r.spec},
           {"calibration", r.calibration}, {"layers", r.layers},
           {"distributed", r.distributed}, {"total_time_s", r.total_time_s}};
  put(j, "model_budget", r.model_budget);
  put(j, "artifact", r.artifact);
  if (r.report) j["report"] = json{{"html", r.report->html}, {"json", r.report->json}};
}
void from_json(const json& j, CompileSummary& r) {
  const char* w = "the compile summary";
  r.checkpoint = get<std::string>(j, w, "checkpoint");
  r.spec = get<std::string>(j, w, "spec");
  r.calibration = get<std::string>(j, w, "calibration");
  r.layers = list<LayerRecord>(j, w, "layers");
  r.distributed = field(j, w, "distributed").get<DistributedRecord>();
  r.total_time_s = num(j, w, "total_time_s");
  r.model_budget.reset();
  if (j.contains("model_budget")) r.model_budget = j["model_budget"].get<ModelBudgetRecord>();
  r.artifact = maybe<std::string>(j, w, "artifact");
  r.report.reset();
  if (j.contains("report"))
    r.report = CompileSummary::ReportPaths{get<std::string>(j["report"], "'report'", "html"),
                                           get<std::string>(j["report"], "'report'", "json")};
}

LayerRecord parse_fit_record(const std::string& fit_json) {
  json j = json::parse(fit_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error("compile record: the fit record is not valid JSON");
  return j.get<LayerRecord>();
}

}  // namespace asap
