// One latency budget for the model (choose.h, docs/decisions.md "One budget
// for the model"): every layer's operators timed, each layer's error
// normalized by its Sinkhorn T' = 1 error, and the exact knapsack of
// budget.h spends the model's latency where the error is.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "asap/error.h"
#include "compile/budget.h"
#include "compile/choose.h"

namespace asap {
namespace compile_detail {

namespace {

ModelError kind_of(ModelErrorKind k) {
  ASAP_ASSERT(k != ModelErrorKind::kAuto);  // resolve_model_error first
  return k == ModelErrorKind::kSum ? ModelError::kSum : ModelError::kMax;
}

// The largest normalized layer error of a choice: what the guard bounds.
double largest_error(const std::vector<BudgetLayer>& bl, const BudgetChoice& c) {
  return model_error(bl, c.choice, ModelError::kMax);
}

// Times the teacher and its loops, then every operator the options allow,
// one per latency key (pooling, target and coefficients do not change the
// time), in chunks; the key's latency is copied to its other candidates.
void time_every_operator(std::vector<OperatorCandidate>& c, Timer& timer, const ChoiceOptions& o) {
  std::vector<int> loops;
  for (size_t i = 1; i < c.size(); ++i)
    if (c[i].op.kind == OperatorKind::kSinkhorn) loops.push_back(static_cast<int>(i));
  timer.time(loops);
  std::map<std::string, int> first_of_key;
  std::vector<int> todo;
  for (size_t i = 0; i < c.size(); ++i)
    if (c[i].latency < 0 && allowed(c[i], o) && first_of_key.emplace(c[i].op.key(), static_cast<int>(i)).second)
      todo.push_back(static_cast<int>(i));
  for (size_t pos = 0; pos < todo.size(); pos += static_cast<size_t>(o.chunk)) {
    const auto end = std::min(todo.size(), pos + static_cast<size_t>(o.chunk));
    timer.time(std::vector<int>(todo.begin() + static_cast<std::ptrdiff_t>(pos),
                                todo.begin() + static_cast<std::ptrdiff_t>(end)));
  }
  for (auto& x : c)
    if (x.latency < 0 && allowed(x, o)) x.latency = c[static_cast<size_t>(first_of_key.at(x.op.key()))].latency;
}

// The layer's budget points: every allowed, timed candidate (index map in
// `of`); with maps_only, its ASAP maps.
BudgetLayer budget_layer(const std::vector<OperatorCandidate>& c, const ChoiceOptions& o, double weight, bool normalize,
                         std::vector<int>& of, bool maps_only = false) {
  BudgetLayer b;
  b.weight = weight;
  b.error_scale = normalize ? error_scale(c) : 1.0;
  of.clear();
  for (size_t i = 0; i < c.size(); ++i)
    if (allowed(c[i], o) && c[i].latency > 0 && std::isfinite(c[i].error) &&
        (!maps_only || c[i].op.kind == OperatorKind::kAsap)) {
      b.points.push_back({c[i].error, c[i].latency});
      of.push_back(static_cast<int>(i));
    }
  return b;
}

// How much closer to the teachers a choice within the timing noise of the
// budget (but over it) must bring the model, or any one layer, to be taken
// over the budget's own choice: the issue's bar ("no operator more than
// twice as far from the teacher as a candidate within the noise").
constexpr double kNoiseGain = 2.0;

// In the per-layer half of that bar, a held-out attention error below
// kNoiseErrorFloor (choose.h) counts as it: "twice as far" from an error of 0 (the teacher itself) or
// of a few hundredths is not a gain worth the budget. On the bundled ViT a
// compile took the margin to store the teacher on layer 0 in place of a
// 4-pass map at 0.023 and the model ran at 1.19x against the 1.25x asked for
// (docs/decisions.md, "One budget for the model"); the case the bar was
// written for, Sinkhorn T' = 4 at 0.071 against a map at 0.032, still takes
// it. The error itself, not the one normalized by softmax's: on the padded
// text teacher softmax's error is 3, and a fraction of it would let layer 0,
// whose error decides the agreement there, go from 0.06 to 0.14 unnoticed.

// Whether `noisy` (within the noise margin) is to be taken over `strict`
// (within the budget): the model kNoiseGain times closer, or one layer whose
// strict operator is more than kNoiseGain times as far from its teacher as
// the noisy one, both errors floored at kNoiseErrorFloor.
bool noise_pays(const std::vector<BudgetLayer>& bl, const BudgetChoice& strict, const BudgetChoice& noisy) {
  if (noisy.model_error * kNoiseGain <= strict.model_error) return true;
  for (size_t l = 0; l < bl.size(); ++l) {
    const auto& pts = bl[l].points;
    const double es = std::max(kNoiseErrorFloor, pts[static_cast<size_t>(strict.choice[l])].error);
    const double en = std::max(kNoiseErrorFloor, pts[static_cast<size_t>(noisy.choice[l])].error);
    if (es > kNoiseGain * en) return true;
  }
  return false;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Times the operators idx[l] of every layer `reps` more times, the layers
// interleaved (so that a burst of load does not land on all of one
// layer's timings); returns each one's timings, its current latency first.
std::vector<std::vector<std::vector<double>>> retime(std::vector<ModelLayer>& layers, std::vector<Timer>& timers,
                                                     const std::vector<std::vector<int>>& idx, int reps) {
  std::vector<std::vector<std::vector<double>>> t(layers.size());
  for (size_t l = 0; l < layers.size(); ++l)
    for (int i : idx[l]) t[l].push_back({(*layers[l].cands)[static_cast<size_t>(i)].latency});
  for (int rep = 0; rep < reps; ++rep)
    for (size_t l = 0; l < layers.size(); ++l) {
      if (idx[l].empty()) continue;
      timers[l].time(idx[l]);
      for (size_t j = 0; j < idx[l].size(); ++j)
        t[l][j].push_back((*layers[l].cands)[static_cast<size_t>(idx[l][j])].latency);
    }
  return t;
}

// Sets candidate i's latency, and that of every candidate of the same key.
void set_latency(std::vector<OperatorCandidate>& c, int i, double latency) {
  const std::string key = c[static_cast<size_t>(i)].op.key();
  for (auto& y : c)
    if (y.latency > 0 && y.op.key() == key) y.latency = latency;
}

// The record's zero_parameter: the --zero-parameter rule a speed budget ran under.
std::optional<std::string> zero_parameter_of(const ChoiceOptions& o) {
  if (o.objective != Objective::kMinSpeedup) return std::nullopt;
  return std::string(o.maps_first ? "fallback" : o.parametric_only ? "never" : "compete");
}

// One set of budget points per layer, and the candidate index of each point.
struct PointSet {
  std::vector<BudgetLayer> bl;
  std::vector<std::vector<int>> of;
};

// Times each layer's frontier operators (of every set) kRetimes more times.
// Their latency becomes the median of their timings (copied to candidates
// of the same key): the choice rests on those. Returns the timing noise:
// the median over those operators of the relative spread of their timings
// (1.4826 times the median absolute deviation over the median: one
// standard deviation of a single timing, robust to a burst of load that
// moves one timing).
constexpr int kRetimes = 4;
double retime_frontiers(std::vector<ModelLayer>& layers, std::vector<Timer>& timers,
                        const std::vector<const PointSet*>& sets) {
  std::vector<std::vector<int>> idx(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const PointSet* ps : sets)
      for (int p : pareto_frontier(ps->bl[l].points)) {
        const int i = ps->of[l][static_cast<size_t>(p)];
        if (i != 0 && std::find(idx[l].begin(), idx[l].end(), i) == idx[l].end())  // the teacher is in every call
          idx[l].push_back(i);
      }
  }
  const auto t = retime(layers, timers, idx, kRetimes);
  std::vector<double> spread;
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t j = 0; j < idx[l].size(); ++j) {
      const double m = median(t[l][j]);
      std::vector<double> dev;
      for (double v : t[l][j]) dev.push_back(std::abs(v - m));
      spread.push_back(1.4826 * median(dev) / m);
      set_latency(*layers[l].cands, idx[l][j], m);
    }
  return spread.empty() ? 0.0 : median(spread);
}

// Times the chosen operators (pick[l]; not the teacher, not yet confirmed)
// kConfirms more times: each one's latency becomes the slower of its
// latency and the median of the new timings, so that an operator chosen
// on a lucky timing meets the budget again. Returns whether any changed.
constexpr int kConfirms = 3;
bool confirm_choice(std::vector<ModelLayer>& layers, std::vector<Timer>& timers, const std::vector<int>& pick,
                    std::vector<std::vector<std::string>>& confirmed) {
  std::vector<std::vector<int>> idx(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::string key = (*layers[l].cands)[static_cast<size_t>(pick[l])].op.key();
    if (pick[l] == 0 || std::find(confirmed[l].begin(), confirmed[l].end(), key) != confirmed[l].end()) continue;
    confirmed[l].push_back(key);
    idx[l].push_back(pick[l]);
  }
  const auto t = retime(layers, timers, idx, kConfirms);
  bool changed = false;
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t j = 0; j < idx[l].size(); ++j) {
      const double before = t[l][j][0];
      const double after = median(std::vector<double>(t[l][j].begin() + 1, t[l][j].end()));
      if (after > before) set_latency(*layers[l].cands, idx[l][j], after), changed = true;
    }
  return changed;
}

std::string passes_phrase(const OperatorCandidate& x) {
  if (x.op.kind == OperatorKind::kTeacher) return "the teacher";
  if (x.op.kind == OperatorKind::kSinkhorn) return x.name;
  return std::to_string(x.op.lse_passes()) + "-pass map " + x.name;
}

// The model record of a choice (one candidate index per layer).
ModelBudgetRecord record_of(const std::vector<ModelLayer>& layers, const std::vector<BudgetLayer>& bl,
                            const std::vector<int>& pick, const std::vector<double>& t0, const ChoiceOptions& o,
                            ModelErrorKind kind) {
  ModelBudgetRecord r;
  r.error = model_error_name(kind);
  double worst = -1;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& x = (*layers[l].cands)[static_cast<size_t>(pick[l])];
    r.layers.push_back(layers[l].spec->name);
    r.weights.push_back(bl[l].weight);
    r.error_scales.push_back(bl[l].error_scale);
    r.teacher_latency_s.push_back(t0[l]);
    r.latency_s.push_back(x.latency);
    r.teacher_total_s += t0[l];
    r.total_s += x.latency;
    const double e = bl[l].normalized({x.error, x.latency});
    r.model_error = kind == ModelErrorKind::kSum ? r.model_error + e : std::max(r.model_error, e);
    if (e > worst) worst = e, r.worst_layer = layers[l].spec->name;
  }
  r.speedup = r.total_s > 0 ? r.teacher_total_s / r.total_s : 0;
  if (o.objective == Objective::kMinSpeedup) r.min_speedup = o.min_speedup;
  if (o.objective == Objective::kMaxError) r.max_error = o.max_error;
  return r;
}

// The model error of a choice with each layer's attention error floored at
// kNoiseErrorFloor: what maps first compares (a layer at 0.01 of its
// teacher is not three times closer than one at 0.03).
double floored_error(const std::vector<BudgetLayer>& bl, const BudgetChoice& b, ModelError kind) {
  double m = 0;
  for (size_t l = 0; l < bl.size(); ++l) {
    BudgetPoint p = bl[l].points[static_cast<size_t>(b.choice[l])];
    p.error = std::max(kNoiseErrorFloor, p.error);
    const double e = bl[l].normalized(p);
    m = kind == ModelError::kSum ? m + e : std::max(m, e);
  }
  return m;
}

// Where a layer stores a loop: the best ASAP map no slower, or that none
// runs as fast (with the fastest map's speed).
std::string asap_next_to(const std::vector<OperatorCandidate>& c, const OperatorCandidate& x) {
  const OperatorCandidate *best = nullptr, *fastest = nullptr;
  for (const auto& y : c) {
    if (y.op.kind != OperatorKind::kAsap || y.latency <= 0) continue;
    if (!fastest || y.latency < fastest->latency) fastest = &y;
    if (y.latency <= x.latency && (!best || y.error < best->error)) best = &y;
  }
  if (best) return "; the best ASAP map no slower, " + best->name + ", has " + fmt(best->error);
  if (fastest)
    return "; no ASAP map runs as fast here (the fastest, " + fastest->name + ", at " +
           times(c[0].latency / fastest->latency) + " the teacher's speed)";
  return "";
}

// The decision line of layer l under the model's choice: what it stores,
// its share of the model's error, and why not the next more accurate
// operator on its frontier.
std::string model_decision(const std::vector<ModelLayer>& layers, const std::vector<BudgetLayer>& bl,
                           const std::vector<std::vector<int>>& of, const std::vector<int>& pick, size_t l,
                           const ModelBudgetRecord& r, const ChoiceOptions& o) {
  const auto& c = *layers[l].cands;
  const auto& x = c[static_cast<size_t>(pick[l])];
  const double t0 = r.teacher_latency_s[l];
  std::string d = passes_phrase(x) + ": held-out attention error " + fmt(x.error) + ", " + times(t0 / x.latency) +
                  " the teacher's speed";
  const int sk = best_sinkhorn_within(c, x.latency);
  if (x.op.kind == OperatorKind::kAsap && sk > 0)
    d += "; the best Sinkhorn no slower, " + c[static_cast<size_t>(sk)].name + ", has " +
         fmt(c[static_cast<size_t>(sk)].error);
  if (x.op.kind != OperatorKind::kAsap) d += asap_next_to(c, x);
  const double e = bl[l].normalized({x.error, x.latency});
  if (r.layers.size() > 1 && r.error == "max")
    d += r.worst_layer == layers[l].spec->name ? "; the model's largest error (" + fmt(e) + " of softmax's)"
                                               : "; " + fmt(e) + " of softmax's error, below the model's largest";
  else if (r.layers.size() > 1)
    d += "; " + fmt(e) + " of softmax's error, of the model's " + fmt(r.model_error) + " summed over the layers";
  // The next more accurate operator of this layer: what it would cost the model.
  const auto front = pareto_frontier(bl[l].points);
  for (int p : front) {
    const auto& y = c[static_cast<size_t>(of[l][static_cast<size_t>(p)])];
    if (!(y.error < x.error) || y.latency <= x.latency) continue;
    const double model = r.teacher_total_s / (r.total_s - x.latency + y.latency);
    d += "; the next more accurate, " + passes_phrase(y) + " (" + fmt(y.error) + "), would put the model at " +
         times(model);
    break;
  }
  d += " -- " + times(r.speedup) + " for the model";
  if (o.objective == Objective::kMinSpeedup && r.unguarded_error) {
    d += " (budget " + times(o.min_speedup) + " not met: its best choice, at " + times(*r.unguarded_speedup) +
         ", leaves a layer at " + fmt(*r.unguarded_error) + " of softmax's error, over --guard " + fmt(*r.guard) +
         "; this is the fastest choice within the guard, up to the timing noise)";
  } else if (o.objective == Objective::kMinSpeedup) {
    d += " (budget " + times(o.min_speedup);
    if (r.within_noise) d += ", met within the timing noise of " + fmt(100 * r.noise_margin, 2) + "%";
    d += ")";
  } else {
    d += std::string(", the fastest assignment whose ") + (r.error == "sum" ? "summed" : "largest") +
         " layer error is within " + fmt(o.max_error);
  }
  return d;
}

// One solution of the budget over a PointSet; `unguarded` is the budget's
// choice when the guard replaced it.
struct Solved {
  const PointSet* ps = nullptr;
  BudgetChoice b;
  std::optional<BudgetChoice> unguarded;
};

// Maps first (ChoiceOptions::maps_first): which of the two solutions was
// stored, and why.
enum class MapsFirst { kOff, kMaps, kNoMaps, kCloser };

// The budget over the model's layers: the point sets (every allowed
// operator; maps first, also the ASAP maps alone), the timing-noise margin
// and the rule that picks among their solutions.
class ModelSolver {
 public:
  ModelSolver(std::vector<ModelLayer>& layers, std::vector<Timer>& timers, const std::vector<double>& t0,
              const ChoiceOptions& o, const ModelChoiceOptions& mo, ModelError kind)
      : layers_(layers), o_(o), mo_(mo), kind_(kind) {
    by_speed_ = o.objective == Objective::kMinSpeedup;
    maps_first_ = by_speed_ && o.maps_first;
    bound_ = mo.guard * (1 + kTieRel);
    for (double t : t0) t_sum_ += t;
    for (PointSet* ps : {&every_, &maps_}) ps->bl.resize(layers.size()), ps->of.resize(layers.size());
    rebuild();
    if (!by_speed_) return;
    if (mo.noise >= 0) {
      margin_ = mo.noise;
      return;
    }
    std::vector<const PointSet*> sets{&every_};
    if (maps_first_) sets.push_back(&maps_);
    measured_ = retime_frontiers(layers, timers, sets);
    margin_ = std::min(mo.noise_cap, std::max(mo.noise_floor, *measured_));
    rebuild();
  }

  // The points again, from the candidates' current latencies.
  void rebuild() {
    for (size_t l = 0; l < layers_.size(); ++l) {
      const auto& L = layers_[l];
      every_.bl[l] = budget_layer(*L.cands, o_, L.weight, by_speed_, every_.of[l]);
      if (maps_first_) maps_.bl[l] = budget_layer(*L.cands, o_, L.weight, by_speed_, maps_.of[l], true);
    }
  }

  // Maps first: the budget over the ASAP maps alone, unless no assignment of
  // maps meets it within the guard, or the budget over every operator brings
  // the model kZeroParameterGain times closer to the teachers (each layer's
  // error floored at kNoiseErrorFloor). other() is the solution not taken.
  Solved solve() {
    Solved a = solve_over(every_);
    mf_ = MapsFirst::kOff;
    if (!maps_first_) return a;
    Solved m = solve_over(maps_);
    if (!m.b.feasible || m.unguarded || (mo_.guard > 0 && largest_error(maps_.bl, m.b) > bound_)) {
      mf_ = MapsFirst::kNoMaps;
      other_ = m;
      return a;
    }
    if (a.b.feasible && !a.unguarded &&
        floored_error(every_.bl, a.b, kind_) * kZeroParameterGain <= floored_error(maps_.bl, m.b, kind_)) {
      mf_ = MapsFirst::kCloser;
      other_ = m;
      return a;
    }
    mf_ = MapsFirst::kMaps;
    other_ = a;
    return m;
  }

  // The candidate index, per layer, of a solution's points.
  std::vector<int> picks(const Solved& r) const {
    std::vector<int> pick;
    for (size_t l = 0; l < layers_.size(); ++l) pick.push_back(r.ps->of[l][static_cast<size_t>(r.b.choice[l])]);
    return pick;
  }

  // What maps first adds to layer l's decision line, given the stored solution.
  std::string clause(const Solved& sol, size_t l) const {
    const auto& c = *layers_[l].cands;
    const bool zero = c[static_cast<size_t>(picks(sol)[l])].op.kind != OperatorKind::kAsap;
    const double here = floored_error(sol.ps->bl, sol.b, kind_);
    if (mf_ == MapsFirst::kMaps && other_.b.feasible) {
      const auto& z = c[static_cast<size_t>(picks(other_)[l])];
      if (z.op.kind == OperatorKind::kAsap) return "";
      return "; ASAP maps first: with plain Sinkhorn and the teacher the budget would store " + passes_phrase(z) +
             " here, the model at " + fmt(floored_error(other_.ps->bl, other_.b, kind_)) +
             " of softmax's error against " + fmt(here) + ", not twice as close";
    }
    if (mf_ == MapsFirst::kNoMaps && zero)
      return "; no choice of ASAP maps alone makes the model " + times(o_.min_speedup) +
             " faster within the guard, so plain Sinkhorn and the teacher are candidates";
    if (mf_ == MapsFirst::kCloser && zero)
      return "; with plain Sinkhorn and the teacher the model is at " + fmt(here) + " of softmax's error against " +
             fmt(floored_error(other_.ps->bl, other_.b, kind_)) +
             " for the best ASAP maps alone, at least twice as close";
    return "";
  }

  // The record's maps_first: which solution was stored (absent: the rule is off).
  std::optional<std::string> outcome() const {
    switch (mf_) {
      case MapsFirst::kMaps:
        return std::string("maps");
      case MapsFirst::kNoMaps:
        return std::string("no-maps-fit");
      case MapsFirst::kCloser:
        return std::string("loops-twice-as-close");
      case MapsFirst::kOff:
        break;
    }
    return std::nullopt;
  }

  double margin() const { return margin_; }
  std::optional<double> measured() const { return measured_; }
  double t_sum() const { return t_sum_; }

 private:
  Solved solve_over(const PointSet& ps) const {
    Solved r;
    r.ps = &ps;
    const auto& bl = ps.bl;
    if (std::any_of(bl.begin(), bl.end(), [](const BudgetLayer& x) { return x.points.empty(); })) return r;
    if (!by_speed_) {
      r.b = fastest_within_error(bl, o_.max_error * (1 + kTieRel), kind_);
      return r;
    }
    // The budget's own choice, and the one within the noise margin: the
    // latter only when it is kNoiseGain times closer to the teachers, for
    // the model or on a layer (else the margin would just become the budget).
    const double budget = t_sum_ / o_.min_speedup;
    BudgetChoice strict = most_accurate_within(bl, budget, 0, kind_);
    BudgetChoice noisy = most_accurate_within(bl, budget, margin_, kind_);
    r.b = noisy.feasible && (!strict.feasible || noise_pays(bl, strict, noisy)) ? noisy : strict;
    // The guard: a choice that leaves the model far from its teachers is not
    // stored for speed; the fastest one within the guard is, when it is no
    // slower than the teachers (theirs, with error 0, always is one when they
    // are in the set; maps slower than the teachers do not replace the
    // budget's choice), or the most accurate within the timing noise of its
    // latency (within the guard too: at most as far as the fastest). The
    // guard bounds every layer's normalized error, whatever --model-error
    // makes of them: a sum over more layers would tighten it.
    if (r.b.feasible && mo_.guard > 0 && largest_error(bl, r.b) > bound_) {
      BudgetChoice g = fastest_within_error(bl, bound_, ModelError::kMax);
      if (g.feasible && g.latency <= t_sum_ * (1 + kTieRel)) {
        BudgetChoice close = most_accurate_within(bl, g.latency, margin_, kind_);
        if (close.feasible && largest_error(bl, close) <= largest_error(bl, g)) g = close;
        g.within_noise = false;  // the budget is not met, whatever the margin
        r.unguarded = r.b;
        r.b = g;
      }
    }
    return r;
  }

  std::vector<ModelLayer>& layers_;
  const ChoiceOptions& o_;
  const ModelChoiceOptions& mo_;
  ModelError kind_;
  bool by_speed_ = false, maps_first_ = false;
  double bound_ = 0, t_sum_ = 0, margin_ = 0;
  std::optional<double> measured_;
  PointSet every_, maps_;
  MapsFirst mf_ = MapsFirst::kOff;
  Solved other_;
};

}  // namespace

ModelChoice choose_for_model(std::vector<ModelLayer>& layers, const ChoiceOptions& o, const ModelChoiceOptions& mo) {
  ASAP_CHECK(!layers.empty(), "choose_for_model: no layers");
  ASAP_CHECK(o.objective != Objective::kFidelity, "choose_for_model: --objective fidelity chooses per layer");
  std::vector<Timer> timers;
  timers.reserve(layers.size());
  std::vector<double> t0;
  for (auto& L : layers) {
    ASAP_CHECK(!L.cands->empty() && (*L.cands)[0].op.kind == OperatorKind::kTeacher,
               "choose_for_model: the first candidate must be the teacher");
    timers.emplace_back(*L.cands, *L.spec, *L.latency);
    time_every_operator(*L.cands, timers.back(), o);
    t0.push_back(timers.back().t0());
  }
  const bool by_speed = o.objective == Objective::kMinSpeedup;
  const ModelErrorKind error = resolve_model_error(mo.error, o.objective);
  const ModelError kind = kind_of(error);
  ModelSolver solver(layers, timers, t0, o, mo, kind);
  Solved sol = solver.solve();
  // The chosen operators are timed again before they are stored; a slower
  // confirmation solves again (latencies only grow, so this ends).
  std::vector<std::vector<std::string>> confirmed(layers.size());
  while (sol.b.feasible) {
    if (!confirm_choice(layers, timers, solver.picks(sol), confirmed)) break;
    solver.rebuild();
    sol = solver.solve();
  }
  const double margin = solver.margin();
  const std::optional<double> measured = solver.measured();
  const double t_sum = solver.t_sum();
  const BudgetChoice& b = sol.b;
  const std::optional<BudgetChoice>& unguarded = sol.unguarded;
  const std::vector<BudgetLayer>& bl = sol.ps->bl;
  const std::vector<std::vector<int>>& of = sol.ps->of;
  ModelChoice mc;
  if (!b.feasible) {  // no assignment meets the model's objective: each layer on its own
    mc.per_layer_fallback = true;
    ChoiceOptions per = o;  // each layer guarded by the model's guard, on its own error
    per.guard = mo.guard;
    for (auto& L : layers) mc.layers.push_back(choose_operator(*L.cands, *L.spec, per, *L.latency));
    mc.record = per_layer_model_record(layers, mc.layers, per, error);
    mc.record.scope = "model";
    mc.record.noise_margin = margin;
    mc.record.noise_measured = measured;
    mc.record.target_met = false;
    const std::string why = by_speed ? "no choice of operators makes the model " + times(o.min_speedup) +
                                           " faster than the teachers, so each layer is chosen on its own: "
                                     : "no choice of operators keeps every layer within attention error " +
                                           fmt(o.max_error) + ", so each layer is chosen on its own: ";
    for (auto& ch : mc.layers) ch.decision = why + ch.decision;
    return mc;
  }
  const std::vector<int> pick = solver.picks(sol);
  mc.record = record_of(layers, bl, pick, t0, o, error);
  mc.record.scope = "model";
  mc.record.noise_margin = margin;
  mc.record.noise_measured = measured;
  mc.record.within_noise = b.within_noise;
  mc.record.target_met = !unguarded;
  if (by_speed && mo.guard > 0) mc.record.guard = mo.guard;
  mc.record.zero_parameter = zero_parameter_of(o);
  mc.record.maps_first = solver.outcome();
  if (unguarded) {
    mc.record.unguarded_error = largest_error(bl, *unguarded);
    mc.record.unguarded_speedup = t_sum / unguarded->latency;
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    Choice ch;
    ch.index = pick[l];
    ch.target_met = !unguarded;
    ch.teacher_latency = t0[l];
    ch.latency_calls = timers[l].calls();
    ch.decision = model_decision(layers, bl, of, pick, l, mc.record, o);
    ch.decision += solver.clause(sol, l);
    mc.layers.push_back(std::move(ch));
  }
  return mc;
}

ModelBudgetRecord per_layer_model_record(const std::vector<ModelLayer>& layers, const std::vector<Choice>& choices,
                                         const ChoiceOptions& o, ModelErrorKind kind) {
  const ModelErrorKind error = resolve_model_error(kind, o.objective);
  std::vector<BudgetLayer> bl;
  std::vector<int> pick;
  std::vector<double> t0;
  for (size_t l = 0; l < layers.size(); ++l) {
    std::vector<int> of;
    bl.push_back(budget_layer(*layers[l].cands, o, layers[l].weight, o.objective == Objective::kMinSpeedup, of));
    pick.push_back(choices[l].index);
    t0.push_back(choices[l].teacher_latency);
  }
  ModelBudgetRecord r = record_of(layers, bl, pick, t0, o, error);
  r.scope = "layer";
  r.target_met = std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.target_met; });
  if (o.objective == Objective::kMinSpeedup && o.guard > 0) r.guard = o.guard;
  r.zero_parameter = zero_parameter_of(o);
  // Where the guard replaced a layer's choice: what the budget's choices
  // would have given the model (the error the guard bounds: the largest).
  if (std::any_of(choices.begin(), choices.end(), [](const Choice& c) { return c.unguarded >= 0; })) {
    std::vector<int> budget_pick;
    for (const auto& c : choices) budget_pick.push_back(c.unguarded >= 0 ? c.unguarded : c.index);
    const ModelBudgetRecord u = record_of(layers, bl, budget_pick, t0, o, ModelErrorKind::kMax);
    r.unguarded_error = u.model_error;
    r.unguarded_speedup = u.speedup;
  }
  return r;
}

}  // namespace compile_detail
}  // namespace asap
