// The choice phase: objectives over measured latencies (compile/choose.h).
#include "compile/choose.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "asap/error.h"

namespace asap {
namespace compile_detail {

using nlohmann::json;

std::string fmt(double x, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}
std::string times(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", x);
  return buf;
}

void Timer::time(const std::vector<int>& which) {
  if (which.empty() && t0_ > 0) return;
  std::vector<OperatorConfig> ops{c_[0].op};
  for (int i : which) ops.push_back(c_[static_cast<size_t>(i)].op);
  auto lat = m_.measure(s_, ops);
  ++calls_;
  ASAP_CHECK(lat.size() == ops.size(), "latency model returned ", lat.size(), " latencies for ", ops.size(),
             " operators");
  for (double x : lat)
    ASAP_CHECK(std::isfinite(x) && x > 0, "layer '", s_.name, "': a measured latency is ", x,
               " seconds (expected a finite positive number)");
  if (t0_ <= 0) {
    t0_ = lat[0];
    c_[0].latency = t0_;
  }
  // (A table's teacher is the same in every call: no rescaling, no rounding.)
  for (size_t j = 1; j < ops.size(); ++j)
    c_[static_cast<size_t>(which[j - 1])].latency = lat[0] == t0_ ? lat[j] : lat[j] / lat[0] * t0_;
}

void Timer::confirm(int i) {
  const double first = c_[static_cast<size_t>(i)].latency;
  time({i});
  c_[static_cast<size_t>(i)].latency = std::max(first, c_[static_cast<size_t>(i)].latency);
}

double error_scale(const std::vector<OperatorCandidate>& c) {
  for (const auto& x : c)
    if (x.op.kind == OperatorKind::kSinkhorn && x.op.steps == 1 && std::isfinite(x.error) && x.error > 0)
      return x.error;
  return 1.0;
}

bool close_to(double a, double b) { return std::abs(a - b) <= kTieRel * std::max(std::abs(a), std::abs(b)); }

bool allowed(const OperatorCandidate& c, const ChoiceOptions& o) {
  if (!c.selectable) return false;
  if (o.fixed_closures > 0 && c.op.kind == OperatorKind::kAsap && c.op.closures != o.fixed_closures) return false;
  return true;
}

int best_sinkhorn_within(const std::vector<OperatorCandidate>& c, double lat) {
  int best = -1;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i].op.kind == OperatorKind::kAsap || c[i].latency < 0 || c[i].latency > lat) continue;
    if (best < 0 || c[i].error < c[static_cast<size_t>(best)].error) best = static_cast<int>(i);
  }
  return best;
}

LatencyChoiceRecord Choice::record(const std::vector<OperatorCandidate>& c) const {
  LatencyChoiceRecord r;
  for (const auto& x : c) {
    LatencyRowRecord row;
    row.op = x.name;
    row.key = x.op.key();
    row.kind = operator_kind_name(x.op.kind);
    row.lse_passes = x.op.lse_passes();
    row.heldout_attention_error = x.error;
    row.selectable = x.selectable;
    if (x.latency > 0) {  // else not timed: its error could not make it win
      row.latency_s = x.latency;
      row.speedup = teacher_latency / x.latency;
    }
    r.operators.push_back(std::move(row));
  }
  r.decision = decision;
  r.target_met = target_met;
  r.teacher_latency_s = teacher_latency;
  r.latency_calls = latency_calls;
  return r;
}

namespace {

// Candidates the options allow, in order of held-out error; errors within
// rounding of each other (kTieRel) are a tie, broken by fewer passes, then
// candidate order.
std::vector<int> error_order(const std::vector<OperatorCandidate>& c, const ChoiceOptions& o) {
  std::vector<int> order;
  for (size_t i = 0; i < c.size(); ++i)
    if (allowed(c[i], o)) order.push_back(static_cast<int>(i));
  auto err = [&](int i) { return c[static_cast<size_t>(i)].error; };
  auto passes = [&](int i) { return c[static_cast<size_t>(i)].op.lse_passes(); };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return err(a) < err(b); });
  for (size_t a = 0; a < order.size();) {
    size_t b = a + 1;
    while (b < order.size() && close_to(err(order[b]), err(order[a]))) ++b;
    std::sort(order.begin() + static_cast<std::ptrdiff_t>(a), order.begin() + static_cast<std::ptrdiff_t>(b),
              [&](int x, int y) { return passes(x) != passes(y) ? passes(x) < passes(y) : x < y; });
    a = b;
  }
  return order;
}

// The fastest of `order` with error within `bound`: every one within it is
// timed. Latencies within rounding are a tie, broken by the error order.
int fastest_within(std::vector<OperatorCandidate>& c, const std::vector<int>& order, Timer& timer,
                   const ChoiceOptions& o, double bound) {
  std::vector<int> ok;
  for (int i : order)
    if (c[static_cast<size_t>(i)].error <= bound * (1 + kTieRel)) ok.push_back(i);
  for (size_t pos = 0; pos < ok.size(); pos += static_cast<size_t>(o.chunk)) {
    std::vector<int> chunk;
    for (size_t q = pos; q < ok.size() && q < pos + static_cast<size_t>(o.chunk); ++q)
      if (c[static_cast<size_t>(ok[q])].latency < 0) chunk.push_back(ok[q]);
    timer.time(chunk);
  }
  int best = -1;
  for (int i : ok) {
    const double li = c[static_cast<size_t>(i)].latency;
    if (best < 0 || (li < c[static_cast<size_t>(best)].latency && !close_to(li, c[static_cast<size_t>(best)].latency)))
      best = i;
  }
  return best;
}

// The guard (--guard under a speed budget): an operator that leaves the
// layer far from its teacher (its error over plain softmax's above o.guard)
// is not stored for speed; the fastest one within the guard is, when it is
// no slower than the teacher. The teacher always is one, unless
// --no-zero-parameter removed it; then a map slower than the teacher does
// not replace the budget's choice, which stays.
void apply_guard(std::vector<OperatorCandidate>& c, const std::vector<int>& order, Timer& timer, const ChoiceOptions& o,
                 Choice& ch) {
  const double bound = o.guard * error_scale(c);
  if (!(o.guard > 0) || c[static_cast<size_t>(ch.index)].error <= bound * (1 + kTieRel)) return;
  const int g = fastest_within(c, order, timer, o, bound);
  if (g < 0 || g == ch.index || c[static_cast<size_t>(g)].latency > timer.t0() * (1 + kTieRel)) return;
  ch.unguarded = ch.index;
  ch.index = g;
  ch.target_met = false;
}

// The decision sentence of a choice (ch.index >= 0) under objective o.
std::string decision_sentence(const std::vector<OperatorCandidate>& c, const Choice& ch, const ChoiceOptions& o) {
  const double t0 = ch.teacher_latency;
  const std::string need = times(o.min_speedup);
  const auto& w = c[static_cast<size_t>(ch.index)];
  const double speed = w.latency > 0 ? t0 / w.latency : 1.0;
  std::string d = w.name + ": held-out attention error " + fmt(w.error) + ", " + times(speed) + " the teacher's speed";
  const int sk = best_sinkhorn_within(c, w.latency);
  if (w.op.kind == OperatorKind::kAsap && sk >= 0 && sk != 0)
    d += "; the best Sinkhorn no slower, " + c[static_cast<size_t>(sk)].name + ", has " +
         fmt(c[static_cast<size_t>(sk)].error);
  if (ch.passed_over >= 0 && ch.unguarded < 0) {
    const auto& z = c[static_cast<size_t>(ch.passed_over)];
    d += "; ASAP maps first: " + z.name + " (" + fmt(z.error) + ", " + times(t0 / z.latency) +
         ") is not twice as close, so the map is stored";
  }
  if (o.objective == Objective::kMinSpeedup && ch.unguarded >= 0) {
    const auto& u = c[static_cast<size_t>(ch.unguarded)];
    d += " -- the " + need + " budget's best choice, " + u.name + " (" + times(t0 / u.latency) +
         "), leaves the layer at " + fmt(u.error / error_scale(c)) + " of plain softmax's error, over --guard " +
         fmt(o.guard) + ", so this is the fastest operator within the guard (budget " + need + " not met)";
  } else if (o.objective == Objective::kMinSpeedup) {
    if (!ch.target_met) {
      d += w.latency < t0 ? " -- no operator reaches " + need +
                                " the teacher's speed here, so this is the most accurate one faster than the teacher"
                          : " -- no operator reaches " + need + " the teacher's speed here, nor is any faster than it";
    } else if (w.op.kind == OperatorKind::kSinkhorn) {
      double best_asap = std::numeric_limits<double>::infinity();
      for (const auto& x : c)
        if (x.op.kind == OperatorKind::kAsap && x.latency > 0 && x.latency <= t0 / o.min_speedup)
          best_asap = std::min(best_asap, x.error);
      d += std::isfinite(best_asap)
               ? (o.maps_first ? " -- plain Sinkhorn is at least twice as close as every ASAP map at "
                               : " -- plain Sinkhorn beats every ASAP map at ") +
                     need + " (best ASAP error there: " + fmt(best_asap) + ")"
               : " -- no ASAP map runs at " + need + " the teacher's speed on this machine and shape";
    } else if (w.op.kind == OperatorKind::kTeacher) {
      d += " -- nothing else is fast enough";
    }
  } else if (o.objective == Objective::kMaxError) {
    d += ch.target_met ? " -- the fastest operator within attention error " + fmt(o.max_error)
                       : " -- no operator reaches attention error " + fmt(o.max_error) + "; this is the most accurate";
  } else {
    d += " -- the most accurate ASAP map within " + std::to_string(o.pass_budget) +
         " log-sum-exp passes (--objective fidelity)";
  }
  return d;
}

}  // namespace

Choice choose_operator(std::vector<OperatorCandidate>& c, const LayerSpec& s, const ChoiceOptions& o,
                       LatencyModel& model) {
  ASAP_CHECK(!c.empty() && c[0].op.kind == OperatorKind::kTeacher,
             "choose_operator: the first candidate must be the teacher");
  Timer timer(c, s, model);
  Choice ch;
  // 1. The teacher and every Sinkhorn budget: the speed reference.
  std::vector<int> loops;
  for (size_t i = 1; i < c.size(); ++i)
    if (c[i].op.kind == OperatorKind::kSinkhorn) loops.push_back(static_cast<int>(i));
  timer.time(loops);
  const double t0 = timer.t0();
  // No candidate is skipped for its latency before it is timed: an ASAP map
  // of p passes need not cost as much as the p-pass loop (a kernel that
  // makes its passes cheaper, a latency table), and a bound that assumes it
  // would skip the map that should win (docs/decisions.md). Only the error
  // order prunes: under min-speedup nothing less accurate than the winner
  // is timed, under max-error nothing outside the bound.

  const std::vector<int> order = error_order(c, o);
  auto within = [](double latency, double target) { return latency > 0 && latency <= target * (1 + kTieRel); };
  // The first candidate in `order` that fits the target, timing untimed
  // ones in chunks (in order) as the scan reaches them.
  auto first_within = [&](const std::vector<int>& seq, double target) -> int {
    for (size_t pos = 0; pos < seq.size(); ++pos) {
      const int i = seq[pos];
      if (c[static_cast<size_t>(i)].latency < 0) {
        std::vector<int> chunk{i};
        for (size_t q = pos + 1; q < seq.size() && static_cast<int>(chunk.size()) < o.chunk; ++q)
          if (c[static_cast<size_t>(seq[q])].latency < 0) chunk.push_back(seq[q]);
        timer.time(chunk);
      }
      auto& x = c[static_cast<size_t>(i)];
      if (!within(x.latency, target)) continue;
      if (x.op.kind == OperatorKind::kAsap) {  // measured once: confirm before choosing
        timer.confirm(i);
        if (!within(x.latency, target)) continue;
      }
      return i;
    }
    return -1;
  };
  // Maps first: the most accurate map within the target, unless the most
  // accurate operator within it is a zero-parameter one kZeroParameterGain
  // times closer (that one is then remembered in passed_over when the map wins).
  std::vector<int> maps;
  for (int i : order)
    if (c[static_cast<size_t>(i)].op.kind == OperatorKind::kAsap) maps.push_back(i);
  auto most_accurate_within = [&](double target) -> int {
    const int any = first_within(order, target);
    if (!o.maps_first || any < 0 || c[static_cast<size_t>(any)].op.kind == OperatorKind::kAsap) return any;
    const int map = first_within(maps, target);
    if (map < 0) return any;
    const double ea = std::max(kNoiseErrorFloor, c[static_cast<size_t>(any)].error);
    const double em = std::max(kNoiseErrorFloor, c[static_cast<size_t>(map)].error);
    if (ea * kZeroParameterGain <= em) return any;
    ch.passed_over = any;
    return map;
  };
  const std::string no_zero = "--no-zero-parameter rules out plain Sinkhorn and the teacher";
  ASAP_CHECK(!order.empty() || o.objective == Objective::kFidelity, "layer '", s.name,
             "': no ASAP map is left to choose from (every candidate's held-out error is NaN",
             o.fixed_closures > 0 ? str(" or its k is not --closures ", o.fixed_closures) : std::string(), ")",
             o.parametric_only ? ", and " + no_zero : std::string());

  const std::string need = times(o.min_speedup);
  if (o.objective == Objective::kMinSpeedup) {
    ASAP_CHECK(o.min_speedup > 0 && std::isfinite(o.min_speedup), "--min-speedup must be a finite number > 0, found ",
               o.min_speedup);
    ch.index = most_accurate_within(t0 / o.min_speedup);
    ch.target_met = ch.index >= 0;
    if (ch.index < 0) ch.index = most_accurate_within(t0 * (1 - 1e-9) / (1 + kTieRel));  // faster than the teacher
    if (ch.index < 0 && o.parametric_only) {
      int fastest = -1;  // every ASAP map has been timed by the scans above
      for (int i : order)
        if (fastest < 0 || c[static_cast<size_t>(i)].latency < c[static_cast<size_t>(fastest)].latency) fastest = i;
      const auto& f = c[static_cast<size_t>(fastest)];
      throw Error(str("layer '", s.name, "': no ASAP map reaches ", need,
                      " the teacher's speed (--min-speedup), nor is "
                      "any faster than the teacher (the fastest, ",
                      f.name, ", runs at ", times(t0 / f.latency), "), and ", no_zero));
    }
    if (ch.index < 0) ch.index = order[0];  // nothing is faster than the teacher: the most accurate (the teacher)
    if (c[static_cast<size_t>(ch.index)].latency < 0) timer.time({ch.index});
    apply_guard(c, order, timer, o, ch);
  } else if (o.objective == Objective::kMaxError) {
    ASAP_CHECK(o.max_error > 0 && std::isfinite(o.max_error), "--max-error must be a finite number > 0, found ",
               o.max_error);
    ch.index = fastest_within(c, order, timer, o, o.max_error);
    ch.target_met = ch.index >= 0;
    if (ch.index < 0) {  // nothing within the bound: only possible without the teacher (error 0)
      const auto& best = c[static_cast<size_t>(order[0])];
      ASAP_CHECK(!o.parametric_only, "layer '", s.name, "': no ASAP map reaches held-out attention error ",
                 fmt(o.max_error), " (--max-error; the most accurate, ", best.name, ", has ", fmt(best.error),
                 "), and ", no_zero);
      ch.index = order[0];
      timer.time({ch.index});
    }
  } else {  // kFidelity: most accurate ASAP map within the pass budget
    for (int i : order) {
      const auto& x = c[static_cast<size_t>(i)];
      if (x.op.kind != OperatorKind::kAsap) continue;
      if (o.fixed_closures == 0 && x.op.lse_passes() > o.pass_budget) continue;
      ch.index = i;
      break;
    }
    ch.target_met = ch.index >= 0;
    if (ch.index >= 0 && c[static_cast<size_t>(ch.index)].latency < 0) timer.time({ch.index});
  }

  ch.teacher_latency = t0;
  ch.latency_calls = timer.calls();
  if (ch.index < 0) return ch;  // no candidate at all (kFidelity without held-out data): the caller's default
  ch.decision = decision_sentence(c, ch, o);
  return ch;
}

}  // namespace compile_detail
}  // namespace asap
