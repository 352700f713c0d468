// Wall-clock timing shared by compile's latency phase and verify.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace asap {
namespace detail {

// Seconds on the steady clock (the default clock of the timers below; tests
// pass their own).
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median wall time of each fn over `repeats` rounds after `warmup` rounds;
// each round calls every fn once (round-robin), so that load drift hits all
// of them alike.
inline std::vector<double> time_round_robin(const std::vector<std::function<void()>>& fns, int warmup, int repeats,
                                            const std::function<double()>& now = steady_seconds) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& f : fns) f();
  std::vector<std::vector<double>> t(fns.size());
  for (int r = 0; r < std::max(1, repeats); ++r)
    for (size_t i = 0; i < fns.size(); ++i) {
      const double t0 = now();
      fns[i]();
      t[i].push_back(now() - t0);
    }
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

// time_round_robin over the fns of every group at once (each round calls
// every fn of every group), the medians returned per group: verify's layers,
// so that a slower stretch of the machine hits every layer alike.
inline std::vector<std::vector<double>> time_groups_round_robin(
    const std::vector<std::vector<std::function<void()>>>& groups, int warmup, int repeats,
    const std::function<double()>& now = steady_seconds) {
  std::vector<std::function<void()>> all;
  for (const auto& g : groups) all.insert(all.end(), g.begin(), g.end());
  const std::vector<double> med = time_round_robin(all, warmup, repeats, now);
  std::vector<std::vector<double>> out;
  size_t i = 0;
  for (const auto& g : groups) {
    out.emplace_back(med.begin() + static_cast<std::ptrdiff_t>(i),
                     med.begin() + static_cast<std::ptrdiff_t>(i + g.size()));
    i += g.size();
  }
  return out;
}

// Repeats that give each of `count` operators about `budget_s` seconds of
// timing when one round of all of them takes `round_s`, within [lo, hi].
inline int repeats_for(double round_s, double budget_s, int lo, int hi) {
  if (!(round_s > 0)) return lo;
  return std::max(lo, std::min(hi, static_cast<int>(budget_s / round_s)));
}

}  // namespace detail
}  // namespace asap
