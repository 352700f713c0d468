// The cost of one fork/join of the thread team, the floor under every fused
// call that runs its heads on more than one thread (docs/performance.md,
// "Fixed cost per call on 2 threads"): at::parallel_for over 64 trivial
// items, and a bare `#pragma omp parallel`, each timed 20001 times; the
// medians are printed. Run by tools/experiments/fork_join.sh.
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {
volatile int64_t g_sink = 0;

template <class F>
void time_it(const char* name, const F& fn) {
  std::vector<double> t;
  for (int r = 0; r < 20001; ++r) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  std::printf("%-28s median %.3f us (%d threads)\n", name, t[t.size() / 2], at::get_num_threads());
}
}  // namespace

int main() {
  time_it("at::parallel_for(0, 64, 1)", [] { at::parallel_for(0, 64, 1, [](int64_t b, int64_t) { g_sink = b; }); });
  time_it("#pragma omp parallel", [] {
#pragma omp parallel
    g_sink = omp_get_thread_num();
  });
  return 0;
}
