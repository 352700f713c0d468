// The cost of one fork/join of the thread team, the floor under every fused
// call that runs its heads on more than one thread (docs/performance.md,
// "Fixed cost per call on 2 threads"): at::parallel_for over 64 trivial
// items, and a bare `#pragma omp parallel`, each timed 20001 times; the
// medians are printed. For scale, the floor of any fork/join between two
// threads: one round trip of a flag between the caller and a std::thread
// that spins on it (no system call on either side); and the cost of one
// system call (getppid), which libgomp's futex wakes pay twice per fork/join
// even under ACTIVE wait (docs/performance.md, "What the second thread
// costs"). Run by tools/experiments/fork_join.sh.
#include <ATen/Parallel.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
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
  // The flag round trip: the caller sets an odd value, the spinning thread
  // answers with the next even one.
  std::atomic<int64_t> flag{0};
  std::atomic<bool> stop{false};
  std::thread peer([&] {
    int64_t seen = 0;
    while (!stop.load(std::memory_order_acquire)) {
      const int64_t v = flag.load(std::memory_order_acquire);
      if (v != seen && (v & 1)) {
        seen = v + 1;
        flag.store(seen, std::memory_order_release);
      }
    }
  });
  int64_t next = 1;
  time_it("spinning flag round trip", [&] {
    flag.store(next, std::memory_order_release);
    while (flag.load(std::memory_order_acquire) != next + 1) {
    }
    next += 2;
  });
  stop.store(true, std::memory_order_release);
  peer.join();
  time_it("one system call (getppid)", [] { g_sink = syscall(SYS_getppid); });
  return 0;
}
