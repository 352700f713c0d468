// Wall-clock timing shared by compile's latency phase and verify.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace asap {
namespace detail {

// Median wall time of each fn over `repeats` rounds after `warmup` rounds;
// each round calls every fn once (round-robin), so that load drift hits all
// of them alike.
inline std::vector<double> time_round_robin(const std::vector<std::function<void()>>& fns, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i)
    for (const auto& f : fns) f();
  std::vector<std::vector<double>> t(fns.size());
  for (int r = 0; r < std::max(1, repeats); ++r)
    for (size_t i = 0; i < fns.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[i]();
      t[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2]);
  }
  return med;
}

// Repeats that give each of `count` operators about `budget_s` seconds of
// timing when one round of all of them takes `round_s`, within [lo, hi].
inline int repeats_for(double round_s, double budget_s, int lo, int hi) {
  if (!(round_s > 0)) return lo;
  return std::max(lo, std::min(hi, static_cast<int>(budget_s / round_s)));
}

}  // namespace detail
}  // namespace asap
