// The compile pipeline (include/asap/compile.h): per layer, the phases of
// compile/phases.h and compile/choose.h in order.
#include "asap/compile.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>

#include "asap/calib.h"
#include "asap/checkpoint.h"
#include "asap/dist.h"
#include "asap/error.h"
#include "asap/features.h"
#include "asap/runtime.h"
#include "compile/attn_fit.h"
#include "compile/choose.h"
#include "compile/kl_fit.h"
#include "compile/phases.h"
#include "io/layer_stream.h"
#include "reference/fit.h"
#include "util/select.h"

namespace asap {

using nlohmann::json;
using namespace compile_detail;

const char* fit_name(FitKind f) {
  switch (f) {
    case FitKind::kLs:
      return "ls";
    case FitKind::kKl:
      return "kl";
    case FitKind::kAttention:
      return "attention";
  }
  return "?";
}

FitKind parse_fit(const std::string& name) {
  for (FitKind f : {FitKind::kLs, FitKind::kKl, FitKind::kAttention})
    if (name == fit_name(f)) return f;
  throw Error(str("--fit must be 'ls', 'kl' or 'attention', found '", name, "'"));
}

const char* targets_name(Targets t) {
  switch (t) {
    case Targets::kBoth:
      return "both";
    case Targets::kClosureReady:
      return "closure-ready";
    case Targets::kKMatched:
      return "k-matched";
  }
  return "?";
}

Targets parse_targets(const std::string& name) {
  for (Targets t : {Targets::kBoth, Targets::kClosureReady, Targets::kKMatched})
    if (name == targets_name(t)) return t;
  throw Error(str("--targets must be both, closure-ready or k-matched, found '", name, "'"));
}

const char* budget_name(BudgetScope b) { return b == BudgetScope::kModel ? "model" : "layer"; }

BudgetScope parse_budget(const std::string& name) {
  for (BudgetScope b : {BudgetScope::kModel, BudgetScope::kLayer})
    if (name == budget_name(b)) return b;
  throw Error(str("--budget must be 'model' or 'layer', found '", name, "'"));
}

const char* zero_parameter_name(ZeroParameter z) {
  return z == ZeroParameter::kFallback ? "fallback" : z == ZeroParameter::kCompete ? "compete" : "never";
}

ZeroParameter parse_zero_parameter(const std::string& name) {
  for (ZeroParameter z : {ZeroParameter::kFallback, ZeroParameter::kCompete, ZeroParameter::kNever})
    if (name == zero_parameter_name(z)) return z;
  throw Error(str("--zero-parameter must be 'fallback', 'compete' or 'never', found '", name, "'"));
}

const char* model_error_name(ModelErrorKind k) {
  return k == ModelErrorKind::kAuto ? "auto" : k == ModelErrorKind::kMax ? "max" : "sum";
}

ModelErrorKind parse_model_error(const std::string& name) {
  for (ModelErrorKind k : {ModelErrorKind::kAuto, ModelErrorKind::kMax, ModelErrorKind::kSum})
    if (name == model_error_name(k)) return k;
  throw Error(str("--model-error must be 'auto', 'max' or 'sum', found '", name, "'"));
}

ModelErrorKind resolve_model_error(ModelErrorKind k, Objective o) {
  if (k != ModelErrorKind::kAuto) return k;
  return o == Objective::kMaxError ? ModelErrorKind::kMax : ModelErrorKind::kSum;
}

bool in_heldout_split(uint64_t seed, double fraction, int64_t example) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(example) + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0) < fraction;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t name_hash(const std::string& s) {  // FNV-1a: a per-layer seed offset
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

const char* objective_name(Objective o) {
  switch (o) {
    case Objective::kMinSpeedup:
      return "min-speedup";
    case Objective::kMaxError:
      return "max-error";
    case Objective::kFidelity:
      return "fidelity";
  }
  return "?";
}

// The validated options and what follows from them for every layer.
struct Setup {
  std::vector<int64_t> slice_counts;
  std::vector<Candidate> candidates;
  std::vector<double> grid;
};

Setup validate_options(const CompileOptions& opt) {
  ASAP_CHECK(opt.heldout_fraction >= 0 && opt.heldout_fraction < 1, "--heldout-fraction must be in [0, 1), found ",
             opt.heldout_fraction);
  ASAP_CHECK(opt.batch_size >= 1, "--batch-size must be at least 1, found ", opt.batch_size);
  ASAP_CHECK(opt.slice_bank >= 1 && opt.slice_bank <= kMaxSliceBank, "--slices must be in 1..", kMaxSliceBank,
             " (each slice is a feature column: more cost memory and latency without gain), found ", opt.slice_bank);
  ASAP_CHECK(opt.attention_iters >= 1, "--attention-iters must be at least 1, found ", opt.attention_iters);
  ASAP_CHECK(opt.attention_patience >= 0, "--attention-patience must be at least 0 (0 = run every iteration), found ",
             opt.attention_patience);
  ASAP_CHECK(opt.max_closures >= 1, "--max-closures must be at least 1, found ", opt.max_closures);
  ASAP_CHECK(opt.selection_examples >= 0, "--selection-examples must be at least 0 (0 = all), found ",
             opt.selection_examples);
  ASAP_CHECK(opt.deploy_batch >= 1, "--deploy-batch must be at least 1, found ", opt.deploy_batch);
  if (opt.objective == Objective::kMinSpeedup)
    ASAP_CHECK(std::isfinite(opt.min_speedup) && opt.min_speedup > 0,
               "--min-speedup must be a finite number > 0, found ", opt.min_speedup);
  if (opt.objective == Objective::kMaxError)
    ASAP_CHECK(std::isfinite(opt.max_error) && opt.max_error > 0, "--max-error must be a finite number > 0, found ",
               opt.max_error);
  for (double w : opt.layer_weights)
    ASAP_CHECK(std::isfinite(w) && w > 0, "--layer-weights must be finite numbers > 0, found ", w);
  ASAP_CHECK(std::isfinite(opt.guard) && opt.guard >= 0, "--guard must be a finite number >= 0 (0: off), found ",
             opt.guard);
  ASAP_CHECK(std::isnan(opt.latency_noise) == false && opt.latency_noise < 1,
             "--latency-noise must be a fraction below 1 (e.g. 0.02), found ", opt.latency_noise);
  Setup u;
  u.slice_counts = opt.slice_counts;
  if (opt.fixed_slices > 0) {
    ASAP_CHECK(opt.fixed_slices <= opt.slice_bank, "--fixed-slices ", opt.fixed_slices, " exceeds the bank size ",
               opt.slice_bank);
    u.slice_counts = {opt.fixed_slices};
  } else if (u.slice_counts.empty()) {
    for (int64_t L : {0, 1, 2, 4, 8, 16, 32, 64, 128, 256})
      if (L < opt.slice_bank) u.slice_counts.push_back(L);
    u.slice_counts.push_back(opt.slice_bank);
  }
  for (int64_t L : u.slice_counts)
    ASAP_CHECK(L >= 0 && L <= opt.slice_bank, "slice count ", L, " outside 0..", opt.slice_bank);
  std::sort(u.slice_counts.begin(), u.slice_counts.end());
  u.slice_counts.erase(std::unique(u.slice_counts.begin(), u.slice_counts.end()), u.slice_counts.end());
  u.candidates = opt.candidates;
  if (u.candidates.empty())
    for (const char* f : kDefaultFeatureFamilies)
      for (bool ph : {false, true}) u.candidates.push_back({f, ph});
  for (const auto& c : u.candidates) family_of(c.features, 1);  // refuses unknown names
  u.grid = opt.ridge_grid.empty() ? default_ridge_grid() : opt.ridge_grid;
  return u;
}

// Closures evaluated per fit: up to --max-closures while the operator stays
// cheaper in passes than the teacher (or within --max-passes under
// --objective fidelity); the paper's map at every k, for the reports; a
// fixed --closures always.
std::vector<int> closures_to_evaluate(const std::vector<Fit>& fits, const LayerSpec& s, const CompileOptions& opt,
                                      int budget) {
  const int limit = opt.objective == Objective::kFidelity ? budget : std::max(budget, s.T - 1);
  std::vector<int> k_eval;
  for (const auto& f : fits) {
    int k = 1;
    if (f.target_k > 0) {  // a k-matched map runs with exactly its k
      k_eval.push_back(f.target_k);
      continue;
    }
    if (f.reference_map) {
      k = opt.max_closures;
    } else {
      while (k < opt.max_closures && lse_passes(f.family, k + 1) <= limit) ++k;
    }
    k_eval.push_back(std::max(k, opt.closures));
  }
  return k_eval;
}

// Every operator the choice may pick: the teacher, Sinkhorn T' < T, each
// fit with k closures. Candidates whose held-out error is NaN cannot be
// compared; they are left out and named in `dropped`.
std::vector<OperatorCandidate> operator_candidates(const LayerSpec& s, const std::vector<Fit>& fits,
                                                   const HeldoutErrors& he, const CompileOptions& opt,
                                                   std::vector<std::string>& dropped) {
  std::vector<OperatorCandidate> c;
  OperatorCandidate t;
  t.op.kind = OperatorKind::kTeacher;
  t.op.steps = s.T;
  t.name = "teacher T=" + std::to_string(s.T);
  t.selectable = opt.zero_parameter != ZeroParameter::kNever;
  c.push_back(t);
  for (int Tp = 1; Tp < s.T; ++Tp) {
    OperatorCandidate x;
    x.op.kind = OperatorKind::kSinkhorn;
    x.op.steps = Tp;
    x.name = "sinkhorn T'=" + std::to_string(Tp);
    x.error = static_cast<size_t>(Tp - 1) < he.sinkhorn.size() ? he.sinkhorn[static_cast<size_t>(Tp - 1)]
                                                               : std::numeric_limits<double>::infinity();
    x.selectable = opt.zero_parameter != ZeroParameter::kNever;
    c.push_back(x);
  }
  for (size_t i = 0; i < fits.size(); ++i)
    for (size_t k = 1; k <= fits[i].error_by_k.size(); ++k) {
      if (fits[i].target_k > 0 && static_cast<int>(k) != fits[i].target_k) continue;
      OperatorCandidate x;
      x.op.kind = OperatorKind::kAsap;
      x.op.family = fits[i].family;
      x.op.closures = static_cast<int>(k);
      x.fit = static_cast<int>(i);
      x.name = fits[i].name() + " k=" + std::to_string(k);
      x.error = fits[i].error_by_k[k - 1];
      if (std::isnan(x.error)) {
        dropped.push_back(x.name);
        continue;
      }
      c.push_back(x);
    }
  return c;
}

// No held-out data: the documented default map (slices+alpha+softmax pooled,
// the full bank) with the teacher-ending closures that fit the budget.
int default_fit(const std::vector<Fit>& fits) {
  for (size_t i = 0; i < fits.size(); ++i)
    if (fits[i].cand.features == "slices+alpha+softmax" && !fits[i].cand.per_head) return static_cast<int>(i);
  return 0;
}
int default_closures_within(const LayerSpec& s, const FeatureFamily& f, int budget) {
  const int preferred = (s.T % 2 == 0) ? 3 : 2;
  for (int k = preferred; k >= 1; k -= 2)
    if (lse_passes(f, k) <= budget) return k;
  return 1;
}

// The candidate fits as the record shows them.
std::vector<FitCandidateRecord> fit_records(const std::vector<Fit>& fits) {
  std::vector<FitCandidateRecord> out;
  for (const auto& f : fits) {
    FitCandidateRecord c;
    c.candidate = f.name();
    c.features = f.cand.features;
    c.target = f.target_k > 0 ? "k-matched" : "closure-ready";
    c.target_closures = f.target_k;
    c.family = f.family.name();
    c.per_head = f.cand.per_head;
    c.slices = f.family.slices;
    c.ridge = f.lambda;
    c.heldout_dual_rmse = f.dual_mse >= 0 ? std::sqrt(f.dual_mse) : -1.0;
    for (size_t k = 1; k <= f.error_by_k.size(); ++k) {
      c.heldout_attention_error_by_k.push_back(f.error_by_k[k - 1]);
      c.lse_passes_by_k.push_back(lse_passes(f.family, static_cast<int>(k)));
    }
    out.push_back(std::move(c));
  }
  return out;
}

// Every rank must compile the same teacher with the same spec and options:
// compared at start-up, naming the first rank and field that differ.
// What the iterative refits (KL, attention) share: cache, batches, the
// held-out minimum, progress, the group, and the usable examples.
template <class RefitOptions>
void refit_common(RefitOptions& o, const CompileOptions& opt, Communicator* comm, const Statistics& st) {
  o.cache_mb = opt.kl_cache_mb;
  o.batch_size = opt.batch_size;
  o.min_heldout = opt.min_heldout;
  o.progress = opt.progress;
  o.comm = comm;
  o.usable = [&st](int64_t e) { return st.usable(e); };
}

void check_same_start(Communicator& comm, const Checkpoint& ck, const std::string& spec_path,
                      const CompileOptions& opt) {
  std::ifstream in(spec_path, std::ios::binary);
  const std::string spec_bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json mine{{"asapc version", ASAP_VERSION_STRING},
                  {"checkpoint (SHA-256)", ck.sha256},
                  {"teacher spec (SHA-256)", sha256_hex(spec_bytes.data(), spec_bytes.size())},
                  {"options", compile_options_json(opt)}};
  require_same_start(comm, mine.dump(), {{"options", "compile option"}},
                     "every rank must compile the same checkpoint with the same spec and options");
}

}  // namespace

json compile_options_json(const CompileOptions& opt) {
  json cands = json::array();
  for (const auto& c : opt.candidates) cands.push_back({c.features, c.per_head});
  return json{{"slice_bank", opt.slice_bank},
              {"slice_counts", opt.slice_counts},
              {"fixed_slices", opt.fixed_slices},
              {"candidates", cands},
              {"objective", objective_name(opt.objective)},
              {"min_speedup", opt.min_speedup},
              {"max_error", opt.max_error},
              {"budget", budget_name(opt.budget)},
              {"model_error", model_error_name(resolve_model_error(opt.model_error, opt.objective))},
              {"layer_weights", opt.layer_weights},
              {"latency_noise", opt.latency_noise},
              {"guard", opt.guard},
              {"deploy_batch", opt.deploy_batch},
              {"latency", opt.latency ? opt.latency->describe() : json("measured")},
              {"zero_parameter", zero_parameter_name(opt.zero_parameter)},
              {"ridge_grid", opt.ridge_grid},
              {"fixed_ridge", opt.ridge},
              {"closures", opt.closures},
              {"max_passes", opt.max_passes},
              {"max_closures", opt.max_closures},
              {"selection_examples", opt.selection_examples},
              {"batch_size", opt.batch_size},
              {"heldout_fraction", opt.heldout_fraction},
              {"min_heldout", opt.min_heldout},
              {"seed", opt.seed},
              {"max_examples", opt.max_examples},
              {"layers", opt.layers},
              {"fit", fit_name(opt.fit)},
              {"kl_ridge", opt.kl_ridge},
              {"kl_max_iters", opt.kl_max_iters},
              {"kl_cache_mb", opt.kl_cache_mb},
              {"attention_iters", opt.attention_iters},
              {"attention_patience", opt.attention_patience},
              {"float64", opt.float64},
              {"targets", targets_name(opt.targets)},
              {"skip_bad_examples", opt.skip_bad_examples}};
}

CompileResult compile_teacher(const std::string& ckpt_path, const std::string& spec_path, const std::string& calib_path,
                              const CompileOptions& opt) {
  return compile_teacher(ckpt_path, spec_path, std::vector<std::string>{calib_path}, opt);
}

namespace {

// What the steps of one layer's compile share.
struct LayerRun {
  const LayerSpec& s;
  LayerStream& stream;
  const Shards& sh;
  const at::Tensor& theta;
  const FeatureFamily& widest;  // every column any candidate uses
  int budget;                   // log-sum-exp passes an ASAP map may use
  const CompileOptions& opt;
  Communicator* comm;
};

// The widest family the candidates need: the statistics compute its columns once.
FeatureFamily widest_family(const Setup& setup, const CompileOptions& opt) {
  FeatureFamily widest{opt.slice_bank, false, false};
  for (const auto& c : setup.candidates) {
    auto f = family_of(c.features, opt.slice_bank);
    widest.alpha |= f.alpha;
    widest.softmax_dual |= f.softmax_dual;
    widest.sinkhorn_dual3 |= f.sinkhorn_dual3;
    widest.score_stats |= f.score_stats;
    widest.centered_stats |= f.centered_stats;
  }
  return widest;
}

// Step 1: the statistics, with their warnings.
Statistics layer_statistics(const LayerRun& r, const std::string& calib_path, PhaseTimes& times) {
  const LayerSpec& s = r.s;
  const CompileOptions& opt = r.opt;
  Statistics st = gather_statistics(r.stream, r.sh, s, r.theta, r.widest, statistics_options(opt),
                                    matched_closures(s, opt.max_closures, opt.targets), times);
  ASAP_CHECK(!st.train.empty(), "calibration file '", calib_path, "': layer '", s.name, "' left no training examples (",
             r.sh.total, " examples, held-out fraction ", opt.heldout_fraction, ")");
  if (!st.excluded.empty() && opt.warn) {
    std::string list;
    for (size_t i = 0; i < st.excluded.size() && i < 10; ++i) list += (i ? ", " : "") + std::to_string(st.excluded[i]);
    if (st.excluded.size() > 10) list += ", ...";
    opt.warn(str("layer '", s.name, "': excluded ", st.excluded.size(),
                 " calibration example(s) whose attention "
                 "scores overflow (--skip-bad-examples): ",
                 list));
  }
  return st;
}

// Step 2: the candidate fits, with their warnings.
FitTable layer_fits(const LayerRun& r, const Statistics& st, const Setup& setup, bool can_select) {
  FitTable ft = fit_candidates(st, r.widest, setup.candidates, setup.slice_counts, setup.grid,
                               FitOptions{r.opt.ridge, r.opt.targets}, can_select);
  if (!ft.nan_fits.empty() && r.opt.warn)
    r.opt.warn(str("layer '", r.s.name, "': ", ft.nan_fits.size(),
                   " candidate fit(s) have a NaN held-out dual error and "
                   "are not considered, e.g. ",
                   ft.nan_fits.front()));
  ASAP_CHECK(!ft.fits.empty(), "layer '", r.s.name,
             "': every candidate fit has a NaN held-out error, so there is no "
             "map to choose (check the calibration data for extreme values)");
  return ft;
}

// Steps 4 + 5: the candidate operators, their latencies and the choice.
struct Chosen {
  std::vector<OperatorCandidate> cands;
  std::vector<std::string> dropped;  // candidates with a NaN held-out error
  bool any_asap = false;
  Choice ch;
  json latency_source;
};

Chosen layer_candidates(const LayerRun& r, const FitTable& ft, const HeldoutErrors& he) {
  Chosen c;
  c.cands = operator_candidates(r.s, ft.fits, he, r.opt, c.dropped);
  if (!c.dropped.empty() && r.opt.warn)
    r.opt.warn(str("layer '", r.s.name, "': ", c.dropped.size(),
                   " candidate operator(s) have a NaN held-out attention error "
                   "and are not considered, e.g. ",
                   c.dropped.front()));
  for (const auto& x : c.cands) c.any_asap |= x.op.kind == OperatorKind::kAsap;
  return c;
}

// The operators are timed with --deploy-threads threads (restored after).
struct DeployThreads {
  explicit DeployThreads(int want) : n(at::get_num_threads()), on(want > 0 && want != n) {
    if (on) at::set_num_threads(want);
  }
  ~DeployThreads() {
    if (on) at::set_num_threads(n);
  }
  int n;
  bool on;
};

// The layer's latency model: the fused operators on held-out examples of
// this rank's files at the deployment batch, or the injected one.
std::shared_ptr<LatencyModel> layer_latency_model(const LayerRun& r, const Statistics& st) {
  if (r.opt.latency) return r.opt.latency;
  std::vector<int64_t> timed;  // held-out examples in this rank's files
  for (int64_t e : st.held_idx)
    if (e >= r.sh.readable_begin && e < r.sh.readable_end) timed.push_back(e);
  if (timed.empty())
    for (int64_t e = r.sh.readable_begin;
         e < r.sh.readable_end && static_cast<int64_t>(timed.size()) < r.opt.deploy_batch; ++e)
      timed.push_back(e);
  return measured_latency(r.stream, r.s, r.theta, timed, r.opt.deploy_batch);
}

ChoiceOptions choice_options(const CompileOptions& opt, int pass_budget) {
  ChoiceOptions co;
  co.objective = opt.objective;
  co.min_speedup = opt.min_speedup;
  co.max_error = opt.max_error;
  co.pass_budget = pass_budget;
  co.fixed_closures = opt.closures;
  co.parametric_only = opt.zero_parameter == ZeroParameter::kNever;
  co.maps_first = opt.zero_parameter == ZeroParameter::kFallback;
  co.guard = opt.guard;
  return co;
}

// One pass of T should cost far less than all of them: when plain softmax
// (T' = 1) times like the teacher, load dominated the timings.
void warn_if_busy(const LayerRun& r, const Chosen& c) {
  if (r.s.T >= 4 && c.cands.size() > 1 && c.cands[1].latency > 0.8 * c.ch.teacher_latency && r.opt.warn)
    r.opt.warn(str("layer '", r.s.name, "': Sinkhorn T' = 1 timed at ", c.cands[1].latency / c.ch.teacher_latency,
                   " of the teacher's latency, so the machine looks too busy for the timings to mean much; the "
                   "choice may not hold on a quiet machine (rerun there, or pass --latency-table)"));
}

// Latency describes the deployment machine: measured once, on rank 0, which
// chooses for every rank.
void choose_on_rank0(const LayerRun& r, const Statistics& st, Chosen& c) {
  DeployThreads threads(r.opt.latency_threads);
  std::shared_ptr<LatencyModel> model = layer_latency_model(r, st);
  c.latency_source = model->describe();
  if (r.opt.progress) r.opt.progress({r.s.name, "latency", 0, 1});
  c.ch = choose_operator(c.cands, r.s, choice_options(r.opt, r.budget), *model);
  if (r.opt.progress) r.opt.progress({r.s.name, "latency", 1, 1});
  warn_if_busy(r, c);
  if (c.ch.unguarded >= 0 && r.opt.warn) {
    const auto& u = c.cands[static_cast<size_t>(c.ch.unguarded)];
    const auto& g = c.cands[static_cast<size_t>(c.ch.index)];
    const double t0 = c.ch.teacher_latency;
    r.opt.warn(str("layer '", r.s.name, "': the ", times(r.opt.min_speedup), " budget's best choice (", u.name, ", ",
                   times(t0 / u.latency), ") leaves the layer at ", fmt(u.error / error_scale(c.cands)),
                   " of plain softmax's attention error, over --guard ", fmt(r.opt.guard),
                   ", so compile stores the fastest operator within the guard (", g.name, ", ", times(t0 / g.latency),
                   "); --guard 0 stores the budget's choice, --objective fidelity the most accurate map"));
  }
}

// The optional refit (--fit kl / attention) of the chosen map, which must
// not end worse than its LS start on held-out data: the attention error of
// the same operator (family, k) with each, on the fast path. Returns the
// refit's record (none without a refit).
std::optional<RefitRecord> refit_layer(const LayerRun& r, const Statistics& st, const Fit& f, int closures,
                                       bool can_select, CompiledLayer& cl) {
  const CompileOptions& opt = r.opt;
  RefitRecord rec;
  rec.fit = fit_name(opt.fit);
  auto is_held = [&](int64_t e) { return in_heldout_split(opt.seed, opt.heldout_fraction, e); };
  if (opt.fit == FitKind::kKl && f.target_k > 0) {
    rec.skipped =
        "the KL objective targets the closure-ready dual; this k-matched map keeps its LS "
        "coefficients";
    return rec;
  } else if (opt.fit == FitKind::kKl) {
    KlOptions ko;
    ko.ridge = opt.kl_ridge;
    ko.max_iters = opt.kl_max_iters;
    refit_common(ko, opt, r.comm, st);
    auto kl = fit_kl(r.stream, r.sh, r.s, r.theta, f.family, f.cand.per_head, f.coef, is_held, ko);
    cl.coef = kl.coef;
    rec.kl = kl.diagnostics;
  } else if (opt.fit == FitKind::kAttention && closures >= 1 && !can_select) {
    // Without held-out data nothing could stop the refit or check it against LS.
    rec.skipped = str("only ", st.n_held, " held-out examples (fewer than ", opt.min_heldout,
                      ") to check the refit against, so the LS coefficients are kept");
    return rec;
  } else if (opt.fit == FitKind::kAttention && closures >= 1) {
    AttnFitOptions ao;
    ao.max_iters = opt.attention_iters;
    ao.patience = opt.attention_patience;
    refit_common(ao, opt, r.comm, st);
    auto af = fit_attention(r.stream, r.sh, r.s, r.theta, f.family, f.coef, closures, is_held, ao);
    cl.coef = af.coef;
    rec.attention = af.diagnostics;
  } else {
    return std::nullopt;
  }
  if (can_select && closures >= 1) {
    const char* what = opt.fit == FitKind::kKl ? "KL fit" : "attention refit";
    std::vector<Fit> pair{f, f};
    pair[1].coef = cl.coef;
    heldout_errors(r.stream, r.sh, r.s, r.theta, r.widest, st.held_idx, pair, {closures, closures}, error_options(opt));
    const double e_ls = pair[0].error_by_k.back(), e_re = pair[1].error_by_k.back();
    rec.heldout_attention_error_ls = e_ls;
    rec.heldout_attention_error_refit = e_re;
    rec.fell_back_to_ls = false;
    if (!(e_re <= e_ls)) {
      cl.coef = f.coef;
      rec.fell_back_to_ls = true;
      if (opt.warn)
        opt.warn(str("layer '", r.s.name, "': the ", what, " ends with held-out attention error ", e_re,
                     ", worse than its LS start's ", e_ls, ", so the LS coefficients are kept"));
    }
  }
  return rec;
}

// Step 6: the compiled layer the choice names (or the documented default).
struct Built {
  CompiledLayer cl;
  int fit_index = -1;
  int closures = 0;
  std::optional<RefitRecord> refit;  // none without a refit
};

Built build_layer(const LayerRun& r, const Statistics& st, const FitTable& ft, Chosen& c, bool can_select) {
  const LayerSpec& s = r.s;
  const CompileOptions& opt = r.opt;
  Built b;
  CompiledLayer& cl = b.cl;
  cl.spec = s;
  cl.weights = r.stream.weights();
  if (c.ch.index >= 0) {
    const OperatorCandidate& w = c.cands[static_cast<size_t>(c.ch.index)];
    cl.kind = w.op.kind;
    if (w.op.kind == OperatorKind::kSinkhorn) cl.sinkhorn_steps = w.op.steps;
    b.fit_index = w.fit;
    b.closures = w.op.closures;
  } else {  // no held-out data (or nothing within the budget): the documented default
    b.fit_index = default_fit(ft.fits);
    const Fit& f = ft.fits[b.fit_index];
    b.closures = f.target_k > 0     ? f.target_k
                 : opt.closures > 0 ? opt.closures
                                    : default_closures_within(s, f.family, r.budget);
    c.ch.decision = !can_select ? "too few held-out examples to choose: the documented default map"
                    : !c.any_asap
                        ? "every ASAP candidate's held-out error is NaN, so none could be chosen on data: the "
                          "documented default map"
                        : "no ASAP map fits the pass budget: the documented default map";
  }
  if (cl.kind == OperatorKind::kAsap) {
    const Fit& f = ft.fits[static_cast<size_t>(b.fit_index)];
    cl.theta = r.theta.narrow(1, 0, f.family.slices).contiguous();  // the prefix the family uses
    cl.family = f.family;
    cl.per_head = f.cand.per_head;
    cl.coef = f.coef;
    cl.default_closures = b.closures;
    b.refit = refit_layer(r, st, f, b.closures, can_select, cl);
  } else {
    cl.theta = at::zeros({s.head_dim, 0}, at::kDouble);
    cl.coef = at::zeros({1, 0}, at::kDouble);
    cl.default_closures = 1;
  }
  return b;
}

// The record of the operator the layer stores.
ChosenRecord chosen_record(const FitTable& ft, const Chosen& c, const Built& b) {
  const CompiledLayer& cl = b.cl;
  ChosenRecord chosen;
  chosen.op = operator_kind_name(cl.kind);
  chosen.description = cl.describe();
  chosen.lse_passes = cl.lse_passes();
  if (cl.kind == OperatorKind::kAsap) {
    const Fit& f = ft.fits[static_cast<size_t>(b.fit_index)];
    chosen.candidate = f.name();
    chosen.target = f.target_k > 0 ? "k-matched" : "closure-ready";
    chosen.family = f.family.name();
    chosen.per_head = f.cand.per_head;
    chosen.slices = f.family.slices;
    chosen.ridge = f.lambda;
    chosen.closures = b.closures;
    chosen.heldout_dual_rmse = f.dual_mse >= 0 ? std::sqrt(f.dual_mse) : -1.0;
  }
  if (cl.kind == OperatorKind::kSinkhorn) chosen.sinkhorn_steps = cl.sinkhorn_steps;
  if (c.ch.index >= 0) {
    const OperatorCandidate& w = c.cands[static_cast<size_t>(c.ch.index)];
    chosen.heldout_attention_error = w.error;
    chosen.latency_s = w.latency;
    chosen.speedup = w.latency > 0 ? c.ch.teacher_latency / w.latency : 1.0;
  } else {
    chosen.heldout_attention_error = -1.0;
  }
  return chosen;
}

// The layer's record: the compile summary's entry and the artifact's fit_json.
LayerRecord layer_record(const LayerRun& r, const Setup& setup, const Statistics& st, const FitTable& ft,
                         const HeldoutErrors& he, const Chosen& c, const Built& b, bool can_select,
                         const PhaseTimes& times, double fit_time_s) {
  const LayerSpec& s = r.s;
  const CompileOptions& opt = r.opt;
  const Choice& ch = c.ch;
  LayerRecord rec;
  rec.layer = s.name;
  rec.T = s.T;
  rec.ending = s.T % 2 == 0 ? "column" : "row";
  rec.examples = r.sh.total;
  rec.examples_per_rank = r.sh.examples_per_rank;
  rec.excluded_examples = st.excluded;
  rec.train_examples = st.train.examples;
  rec.heldout_examples = st.n_held;
  rec.selection_examples = he.examples;
  rec.rows_used = static_cast<int64_t>(st.train.R.sum().item<double>());
  rec.data_driven_selection = can_select && ch.index >= 0;
  rec.candidates_with_nan_error = c.dropped;
  rec.objective.name = objective_name(opt.objective);
  if (opt.objective == Objective::kMinSpeedup) rec.objective.min_speedup = opt.min_speedup;
  if (opt.objective == Objective::kMaxError) rec.objective.max_error = opt.max_error;
  if (opt.objective == Objective::kFidelity) rec.objective.pass_budget = r.budget;
  rec.pass_budget = r.budget;
  rec.decision = ch.decision;
  rec.target_met = ch.index >= 0 && ch.target_met;
  rec.chosen = chosen_record(ft, c, b);
  rec.candidates = fit_records(ft.fits);
  rec.sinkhorn_heldout_attention_error = he.sinkhorn;
  rec.slice_selection = ft.slice_tables;
  rec.latency.source = c.latency_source;
  if (can_select) rec.latency.choice = ch.record(c.cands);
  rec.fit = fit_name(opt.fit);
  rec.fit_time_s = fit_time_s;
  rec.teacher_time_s = times.teacher;
  rec.phase_times_s = times;
  rec.options =
      RecordOptions{opt.slice_bank, setup.slice_counts, setup.grid,       opt.ridge,        opt.heldout_fraction,
                    opt.seed,       opt.batch_size,     opt.deploy_batch, opt.max_closures, opt.float64};
  rec.refit = b.refit;
  return rec;
}

// One layer's evaluation, kept until every layer has one (the model budget
// chooses across them). Not movable: `run` refers into it.
struct LayerWork {
  LayerWork(const LayerSpec& spec, CalibFile& calib, const Checkpoint& ck, const Setup& setup,
            const CompileOptions& opt)
      : s(spec),
        stream(calib, spec, ck, opt.float64, opt.comm ? 0 : opt.max_examples),
        sh(make_shards(opt.comm.get(), calib, stream.num_examples(), opt.max_examples)),
        budget(opt.max_passes > 0 ? opt.max_passes : std::max(1, spec.T - 2)),
        widest(widest_family(setup, opt)),
        theta(make_slice_bank(spec.head_dim, opt.slice_bank, opt.seed ^ name_hash(spec.name))),
        run{s, stream, sh, theta, widest, budget, opt, opt.comm.get()} {
    stream.set_first_example(sh.readable_begin);
  }
  LayerWork(const LayerWork&) = delete;
  LayerWork& operator=(const LayerWork&) = delete;

  const LayerSpec& s;
  LayerStream stream;
  Shards sh;
  int budget;  // log-sum-exp passes an ASAP map may use
  FeatureFamily widest;
  at::Tensor theta;
  LayerRun run;
  PhaseTimes times;
  Statistics st;
  bool can_select = false;
  FitTable ft;
  HeldoutErrors he;
  Chosen c;
  double seconds = 0;  // spent in this layer's phases
};

// Steps 1 to 3 of one layer, and its candidate operators.
std::unique_ptr<LayerWork> evaluate_layer(const LayerSpec& s, const Checkpoint& ck, CalibFile& calib,
                                          const std::string& spec_path, const Setup& setup, const CompileOptions& opt) {
  const auto t_layer = Clock::now();
  ASAP_CHECK(s.T >= 2, "teacher spec '", spec_path, "': layer '", s.name, "' has T = ", s.T,
             " (plain softmax): there is no Sinkhorn loop to amortize, so asapc refuses to compile it");
  auto w = std::make_unique<LayerWork>(s, calib, ck, setup, opt);
  if (s.T <= 3 && opt.warn)
    opt.warn(str("layer '", s.name, "' has T = ", s.T,
                 ": few operators can be both faster than the teacher and "
                 "close to it"));
  const LayerRun& r = w->run;
  w->st = layer_statistics(r, calib.path(), w->times);  // 1. statistics
  w->can_select = w->st.n_held >= opt.min_heldout;
  if (!w->can_select && opt.warn)
    opt.warn(str("layer '", s.name, "': only ", w->st.n_held, " held-out examples (fewer than ", opt.min_heldout,
                 "): ridge, slices, features and closures fall back to documented defaults"));
  auto t = Clock::now();
  w->ft = layer_fits(r, w->st, setup, w->can_select);  // 2. candidate fits (3. adds their errors)
  w->times.solve = seconds_since(t);
  t = Clock::now();
  if (w->can_select)  // 3. held-out errors of every candidate operator
    w->he = heldout_errors(w->stream, w->sh, s, w->theta, w->widest, w->st.held_idx, w->ft.fits,
                           closures_to_evaluate(w->ft.fits, s, opt, w->budget), error_options(opt));
  w->times.selection = seconds_since(t);
  w->c = layer_candidates(r, w->ft, w->he);
  w->seconds = seconds_since(t_layer);
  return w;
}

// Steps 4 + 5, each layer on its own (--budget layer, --objective fidelity).
void choose_per_layer(LayerWork& w) {
  const auto t = Clock::now();
  Communicator* comm = w.run.comm;
  if (w.can_select && (!comm || comm->rank() == 0)) choose_on_rank0(w.run, w.st, w.c);
  if (w.can_select && comm) {
    std::vector<double> idx{static_cast<double>(w.c.ch.index)};
    const auto tc = Clock::now();
    comm->broadcast(idx, 0);
    w.times.communication += seconds_since(tc);
    w.c.ch.index = static_cast<int>(idx[0]);
  }
  w.times.latency = seconds_since(t);
  w.seconds += w.times.latency;
}

// The layers' model inputs (weights from --layer-weights).
std::vector<ModelLayer> model_layers(std::vector<std::unique_ptr<LayerWork>>& work, const CompileOptions& opt,
                                     std::vector<std::shared_ptr<LatencyModel>>& models) {
  std::vector<ModelLayer> ml;
  for (size_t l = 0; l < work.size(); ++l) {
    ModelLayer m;
    m.spec = &work[l]->s;
    m.cands = &work[l]->c.cands;
    m.latency = l < models.size() ? models[l].get() : nullptr;
    m.weight = opt.layer_weights.empty() ? 1.0 : opt.layer_weights[l];
    ml.push_back(m);
  }
  return ml;
}

// Steps 4 + 5 for the model (--budget model): rank 0 times every layer's
// operators and solves; every rank stores its choice. Returns the model's
// record (rank 0).
std::optional<ModelBudgetRecord> choose_for_the_model(std::vector<std::unique_ptr<LayerWork>>& work,
                                                      const CompileOptions& opt) {
  const auto t = Clock::now();
  Communicator* comm = opt.comm.get();
  std::optional<ModelBudgetRecord> rec;
  std::vector<double> idx(work.size(), -1.0);
  if (!comm || comm->rank() == 0) {
    DeployThreads threads(opt.latency_threads);
    std::vector<std::shared_ptr<LatencyModel>> models;
    for (auto& w : work) {
      models.push_back(layer_latency_model(w->run, w->st));
      w->c.latency_source = models.back()->describe();
    }
    std::vector<ModelLayer> ml = model_layers(work, opt, models);
    ModelChoiceOptions mo;
    mo.error = resolve_model_error(opt.model_error, opt.objective);
    mo.noise = opt.latency_noise;
    mo.guard = opt.guard;
    if (opt.progress) opt.progress({"model", "latency", 0, 1});
    ModelChoice mc = choose_for_model(ml, choice_options(opt, work[0]->budget), mo);
    if (opt.progress) opt.progress({"model", "latency", 1, 1});
    for (size_t l = 0; l < work.size(); ++l) {
      work[l]->c.ch = mc.layers[l];
      warn_if_busy(work[l]->run, work[l]->c);
      idx[l] = mc.layers[l].index;
    }
    rec = mc.record;
    if (rec->unguarded_error && opt.warn)
      opt.warn(str("the ", times(opt.min_speedup), " budget's best choice (", times(*rec->unguarded_speedup),
                   ") leaves a layer at ", fmt(*rec->unguarded_error),
                   " of plain softmax's attention error, over --guard ", fmt(opt.guard),
                   ", so compile stores the fastest choice within the guard, up to the timing noise (",
                   times(rec->speedup),
                   "); --guard 0 stores the budget's choice, --objective fidelity the most "
                   "accurate maps"));
  }
  if (comm) {
    const auto tc = Clock::now();
    comm->broadcast(idx, 0);
    work[0]->times.communication += seconds_since(tc);
    for (size_t l = 0; l < work.size(); ++l) work[l]->c.ch.index = static_cast<int>(idx[l]);
  }
  const double share = seconds_since(t) / static_cast<double>(work.size());
  for (auto& w : work) w->times.latency = share, w->seconds += share;
  return rec;
}

// Whether the model budget applies: --budget model with a latency
// objective, and a data-driven choice on every layer (else each layer
// chooses on its own, with a warning naming the layer).
bool model_budget_applies(const std::vector<std::unique_ptr<LayerWork>>& work, const CompileOptions& opt) {
  if (opt.budget != BudgetScope::kModel || opt.objective == Objective::kFidelity) return false;
  for (const auto& w : work)
    if (!w->can_select) {
      if (opt.warn)
        opt.warn(str("layer '", w->s.name,
                     "' has too few held-out examples for a data-driven choice, so the model budget (--budget "
                     "model) does not apply: each layer is chosen on its own"));
      return false;
    }
  return true;
}

// Step 6 and the record of one layer.
std::pair<CompiledLayer, LayerRecord> finish_layer(LayerWork& w, const Setup& setup,
                                                   const std::optional<ModelBudgetRecord>& model, int64_t& bytes_read) {
  const auto t = Clock::now();
  Built b = build_layer(w.run, w.st, w.ft, w.c, w.can_select);  // 6. the compiled layer
  w.seconds += seconds_since(t);
  LayerRecord rec = layer_record(w.run, setup, w.st, w.ft, w.he, w.c, b, w.can_select, w.times, w.seconds);
  rec.model = model;
  bytes_read += w.stream.bytes_read();
  b.cl.fit_json = json(rec).dump();  // the artifact's fit record: the file edge
  return {std::move(b.cl), std::move(rec)};
}

// Steps 4 + 5 for every layer: the model's budget, or each layer's own.
std::optional<ModelBudgetRecord> choose_operators(std::vector<std::unique_ptr<LayerWork>>& work,
                                                  const CompileOptions& opt) {
  if (model_budget_applies(work, opt)) return choose_for_the_model(work, opt);
  for (auto& w : work) choose_per_layer(*w);
  Communicator* comm = opt.comm.get();
  const bool all_timed = std::all_of(work.begin(), work.end(), [](const std::unique_ptr<LayerWork>& w) {
    return w->can_select && w->c.ch.index >= 0 && w->c.ch.teacher_latency > 0;
  });
  if (!all_timed || opt.objective == Objective::kFidelity || (comm && comm->rank() != 0)) return std::nullopt;
  std::vector<std::shared_ptr<LatencyModel>> none;
  std::vector<ModelLayer> ml = model_layers(work, opt, none);
  std::vector<Choice> ch;
  for (auto& w : work) ch.push_back(w->c.ch);
  return per_layer_model_record(ml, ch, choice_options(opt, work[0]->budget),
                                resolve_model_error(opt.model_error, opt.objective));
}

// The summary's "distributed" record: world size, bytes read, communication.
DistributedRecord distributed_record(Communicator* comm, int64_t bytes_read) {
  DistributedRecord dist;
  dist.world_size = comm ? comm->world_size() : 1;
  dist.calibration_bytes_read = static_cast<double>(bytes_read);
  if (comm) {
    const auto stats = comm->stats();
    std::vector<double> v{static_cast<double>(bytes_read), stats.comm_seconds};
    DistributedRecord::Group g;
    g.communication_s_rank0 = stats.comm_seconds;
    g.bytes_reduced = stats.bytes_reduced;
    g.reductions = stats.collectives;
    comm->allreduce_sum(v);
    dist.calibration_bytes_read = v[0];
    g.communication_s_mean = v[1] / comm->world_size();
    dist.group = g;
  }
  return dist;
}

}  // namespace

CompileResult compile_teacher(const std::string& ckpt_path, const std::string& spec_path,
                              const std::vector<std::string>& calib_paths, const CompileOptions& opt) {
  const auto t_all = Clock::now();
  Communicator* comm = opt.comm.get();
  const Setup setup = validate_options(opt);
  Checkpoint ck = load_checkpoint(ckpt_path);
  TeacherSpec spec = read_spec(spec_path);
  validate_spec(spec, ck, spec_path);
  if (comm) check_same_start(*comm, ck, spec_path, opt);
  CalibFile calib(calib_paths);
  int64_t bytes_read = 0;
  const std::vector<const LayerSpec*> layers = detail::select_by_name(
      spec.layers, opt.layers, [](const LayerSpec& l) { return l.name; },
      [&](const std::string& name) {
        return str("--layers names '", name, "', which teacher spec '", spec_path, "' does not describe");
      });

  ASAP_CHECK(opt.layer_weights.empty() || opt.layer_weights.size() == layers.size(), "--layer-weights gives ",
             opt.layer_weights.size(), " weight(s) for ", layers.size(), " compiled layer(s); give one per layer");
  CompileResult result;
  Artifact& art = result.artifact;
  art.asapc_version = ASAP_VERSION_STRING;
  art.teacher_sha256 = ck.sha256;
  art.teacher_file = ck.path.substr(ck.path.find_last_of('/') + 1);
  art.created_utc = utc_now();
  result.summary.checkpoint = ckpt_path;
  result.summary.spec = spec_path;
  result.summary.calibration = calib.path();
  std::vector<std::unique_ptr<LayerWork>> work;  // 1-3 for every layer before any choice
  for (const LayerSpec* lp : layers) work.push_back(evaluate_layer(*lp, ck, calib, spec_path, setup, opt));
  const std::optional<ModelBudgetRecord> model = choose_operators(work, opt);  // 4 + 5
  for (auto& w : work) {                                                       // 6
    auto layer = finish_layer(*w, setup, model, bytes_read);
    art.layers.push_back(std::move(layer.first));
    result.summary.layers.push_back(std::move(layer.second));
  }
  result.summary.model_budget = model;
  result.summary.distributed = distributed_record(comm, bytes_read);
  result.summary.total_time_s = seconds_since(t_all);
  return result;
}

}  // namespace asap
