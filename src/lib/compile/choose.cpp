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

namespace {

std::string fmt(double x, int digits = 3) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, x);
  return buf;
}
std::string times(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", x);
  return buf;
}

class Timer {
 public:
  Timer(std::vector<OperatorCandidate>& c, const LayerSpec& s, LatencyModel& m) : c_(c), s_(s), m_(m) {}

  // Times the teacher with `which`; latencies relative to the teacher's
  // first measurement (t0), so that drift between calls cancels.
  void time(const std::vector<int>& which) {
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
    for (size_t j = 1; j < ops.size(); ++j) c_[static_cast<size_t>(which[j - 1])].latency = lat[j] / lat[0] * t0_;
  }
  // Times i again against the teacher; its latency becomes the slower of
  // the two relative measurements, so that a winner meets the target twice
  // (a choice right at the target otherwise fails it in half the reruns).
  void confirm(int i) {
    const double first = c_[static_cast<size_t>(i)].latency;
    time({i});
    c_[static_cast<size_t>(i)].latency = std::max(first, c_[static_cast<size_t>(i)].latency);
  }
  double t0() const { return t0_; }
  int calls() const { return calls_; }

 private:
  std::vector<OperatorCandidate>& c_;
  const LayerSpec& s_;
  LatencyModel& m_;
  double t0_ = -1;
  int calls_ = 0;
};

bool allowed(const OperatorCandidate& c, const ChoiceOptions& o) {
  if (!c.selectable) return false;
  if (o.fixed_closures > 0 && c.op.kind == OperatorKind::kAsap && c.op.closures != o.fixed_closures) return false;
  return true;
}

// The best Sinkhorn (or teacher) with latency <= lat: index, or -1.
int best_sinkhorn_within(const std::vector<OperatorCandidate>& c, double lat) {
  int best = -1;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i].op.kind == OperatorKind::kAsap || c[i].latency < 0 || c[i].latency > lat) continue;
    if (best < 0 || c[i].error < c[static_cast<size_t>(best)].error) best = static_cast<int>(i);
  }
  return best;
}

}  // namespace

json Choice::to_json(const std::vector<OperatorCandidate>& c) const {
  json table = json::array();
  for (const auto& x : c) {
    json row{{"operator", x.name},       {"key", x.op.key()},       {"kind", operator_kind_name(x.op.kind)},
             {"lse_passes", x.op.lse_passes()}, {"heldout_attention_error", x.error}, {"selectable", x.selectable}};
    if (x.latency > 0) {
      row["latency_s"] = x.latency;
      row["speedup"] = teacher_latency / x.latency;
    } else {
      row["latency_s"] = nullptr;  // not timed: its error could not make it win
    }
    if (x.lower_bound > 0) row["latency_lower_bound_s"] = x.lower_bound;
    table.push_back(row);
  }
  return json{{"decision", decision}, {"target_met", target_met}, {"teacher_latency_s", teacher_latency},
              {"latency_calls", latency_calls}, {"operators", table}};
}

Choice choose_operator(std::vector<OperatorCandidate>& c, const LayerSpec& s, const ChoiceOptions& o,
                       LatencyModel& model) {
  ASAP_CHECK(!c.empty() && c[0].op.kind == OperatorKind::kTeacher, "choose_operator: the first candidate must be the teacher");
  Timer timer(c, s, model);
  Choice ch;
  // 1. The teacher and every Sinkhorn budget: the reference and the bounds.
  std::vector<int> loops;
  for (size_t i = 1; i < c.size(); ++i)
    if (c[i].op.kind == OperatorKind::kSinkhorn) loops.push_back(static_cast<int>(i));
  timer.time(loops);
  const double t0 = timer.t0();
  std::vector<double> by_passes(static_cast<size_t>(s.T) + 1, -1);  // latency of the loop with p passes
  by_passes[static_cast<size_t>(s.T)] = t0;
  for (int i : loops) by_passes[static_cast<size_t>(c[static_cast<size_t>(i)].op.steps)] = c[static_cast<size_t>(i)].latency;
  // An ASAP operator of p passes runs those p passes and more (features,
  // projections onto slices, the prediction): the loop of p passes bounds
  // it, plus its slices at the cheapest per-slice cost measured so far in
  // this run (0 before any sliced operator is timed). 10% slack for noise.
  auto loop_of = [&](int p) {
    return p <= s.T && by_passes[static_cast<size_t>(p)] > 0 ? by_passes[static_cast<size_t>(p)] : t0 * p / s.T;
  };
  double per_slice = -1;
  auto update_bounds = [&] {
    for (const auto& x : c)
      if (x.op.kind == OperatorKind::kAsap && x.latency > 0 && x.op.family.slices > 0) {
        const double v = std::max(0.0, (x.latency - loop_of(x.op.lse_passes())) / static_cast<double>(x.op.family.slices));
        per_slice = per_slice < 0 ? v : std::min(per_slice, v);
      }
    for (auto& x : c)
      if (x.op.kind == OperatorKind::kAsap)
        x.lower_bound = 0.9 * (loop_of(x.op.lse_passes()) +
                               std::max(0.0, per_slice) * static_cast<double>(x.op.family.slices));
  };
  update_bounds();

  // Candidates in order of error (fewer passes on ties).
  std::vector<int> order;
  for (size_t i = 0; i < c.size(); ++i)
    if (allowed(c[i], o)) order.push_back(static_cast<int>(i));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const auto &x = c[static_cast<size_t>(a)], &y = c[static_cast<size_t>(b)];
    if (x.error != y.error) return x.error < y.error;
    return x.op.lse_passes() < y.op.lse_passes();
  });
  auto untimed_could_fit = [&](int i, double target) {
    const auto& x = c[static_cast<size_t>(i)];
    return x.latency < 0 && x.lower_bound <= target;
  };
  // The first candidate in `order` (from position `from`) that fits the
  // target, timing untimed ones in chunks as the scan reaches them.
  auto most_accurate_within = [&](double target) -> int {
    for (size_t pos = 0; pos < order.size(); ++pos) {
      const int i = order[pos];
      if (untimed_could_fit(i, target)) {
        std::vector<int> chunk{i};
        for (size_t q = pos + 1; q < order.size() && static_cast<int>(chunk.size()) < o.chunk; ++q)
          if (untimed_could_fit(order[q], target)) chunk.push_back(order[q]);
        timer.time(chunk);
        update_bounds();
      }
      auto& x = c[static_cast<size_t>(i)];
      if (x.latency < 0 || x.latency > target) continue;
      if (x.op.kind == OperatorKind::kAsap) {  // measured once: confirm before choosing
        timer.confirm(i);
        if (x.latency > target) continue;
      }
      return i;
    }
    return -1;
  };

  const std::string need = times(o.min_speedup);
  if (o.objective == Objective::kMinSpeedup) {
    ASAP_CHECK(o.min_speedup > 0 && std::isfinite(o.min_speedup), "--min-speedup must be a finite number > 0, found ",
               o.min_speedup);
    ch.index = most_accurate_within(t0 / o.min_speedup);
    ch.target_met = ch.index >= 0;
    if (ch.index < 0) ch.index = most_accurate_within(t0 * (1 - 1e-9));  // anything faster than the teacher
    if (ch.index < 0 && !order.empty()) ch.index = order[0];  // the teacher itself when allowed, else the most accurate
    if (ch.index < 0) ch.index = 0;
    if (c[static_cast<size_t>(ch.index)].latency < 0) timer.time({ch.index});
  } else if (o.objective == Objective::kMaxError) {
    ASAP_CHECK(o.max_error > 0 && std::isfinite(o.max_error), "--max-error must be a finite number > 0, found ",
               o.max_error);
    // Fastest within the error bound: time candidates in order of their bound
    // while the bound could still beat the fastest so far.
    std::vector<int> ok;
    for (int i : order)
      if (c[static_cast<size_t>(i)].error <= o.max_error) ok.push_back(i);
    std::stable_sort(ok.begin(), ok.end(), [&](int a, int b) {
      auto key = [&](int i) {
        const auto& x = c[static_cast<size_t>(i)];
        return x.latency > 0 ? x.latency : x.lower_bound;
      };
      return key(a) < key(b);
    });
    auto best_timed = [&] {
      int b = -1;
      for (int i : ok)
        if (c[static_cast<size_t>(i)].latency > 0 &&
            (b < 0 || c[static_cast<size_t>(i)].latency < c[static_cast<size_t>(b)].latency))
          b = i;
      return b;
    };
    for (size_t pos = 0; pos < ok.size(); ++pos) {
      const int b = best_timed();
      const double best = b >= 0 ? c[static_cast<size_t>(b)].latency : std::numeric_limits<double>::infinity();
      if (c[static_cast<size_t>(ok[pos])].latency >= 0 || c[static_cast<size_t>(ok[pos])].lower_bound > best) continue;
      std::vector<int> chunk;
      for (size_t q = pos; q < ok.size() && static_cast<int>(chunk.size()) < o.chunk; ++q)
        if (c[static_cast<size_t>(ok[q])].latency < 0 && c[static_cast<size_t>(ok[q])].lower_bound <= best)
          chunk.push_back(ok[q]);
      timer.time(chunk);
      update_bounds();
    }
    ch.index = best_timed();
    ch.target_met = ch.index >= 0;
    if (ch.index < 0 && !order.empty()) {  // nothing within the bound (the teacher not a candidate): most accurate
      ch.index = order[0];
      timer.time({ch.index});
    }
    if (ch.index < 0) ch.index = 0;
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

  // The sentence.
  ch.teacher_latency = t0;
  ch.latency_calls = timer.calls();
  if (ch.index < 0) return ch;  // no candidate at all (kFidelity without held-out data): the caller's default
  const auto& w = c[static_cast<size_t>(ch.index)];
  const double speed = w.latency > 0 ? t0 / w.latency : 1.0;
  std::string d = w.name + ": held-out attention error " + fmt(w.error) + ", " + times(speed) + " the teacher's speed";
  const int sk = best_sinkhorn_within(c, w.latency);
  if (w.op.kind == OperatorKind::kAsap && sk >= 0 && sk != 0)
    d += "; the best Sinkhorn no slower, " + c[static_cast<size_t>(sk)].name + ", has " +
         fmt(c[static_cast<size_t>(sk)].error);
  if (o.objective == Objective::kMinSpeedup) {
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
               ? " -- plain Sinkhorn beats every ASAP map at " + need + " (best ASAP error there: " + fmt(best_asap) + ")"
               : " -- no ASAP map runs at " + need + " the teacher's speed on this machine and shape";
    } else if (w.op.kind == OperatorKind::kTeacher) {
      d += " -- nothing else is fast enough";
    }
  } else if (o.objective == Objective::kMaxError) {
    d += ch.target_met ? " -- the fastest operator within attention error " + fmt(o.max_error)
                       : " -- no operator reaches attention error " + fmt(o.max_error) + "; this is the most accurate";
  } else {
    d += " -- the most accurate ASAP map within " + std::to_string(o.pass_budget) + " log-sum-exp passes (--objective fidelity)";
  }
  ch.decision = d;
  return ch;
}

}  // namespace compile_detail
}  // namespace asap
