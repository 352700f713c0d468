// measure_peak (fast/fast.h): the machine's multiply-add and exponential
// throughput on the fused kernels' own instruction set, all threads busy.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "asap/error.h"
#include "fast/common.h"

namespace asap {
namespace fast {

namespace {

// Where the probes' results go, so that their loops are kept.
volatile double g_peak_sink = 0;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs work(thread) once on each of `threads` threads at the same time and
// returns the wall time of the slowest.
template <class F>
double timed_on_all(int threads, const F& work) {
  const double t0 = now_s();
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) work(t);
  });
  return now_s() - t0;
}

template <class T>
MachinePeak peak_of(const detail::KernelTable<T>& kt, int rounds) {
  MachinePeak p;
  p.threads = std::max(1, at::get_num_threads());
  p.isa = kt.isa;
  std::vector<double> sink(static_cast<size_t>(p.threads), 0.0);  // one slot per thread
  // Multiply-adds: 2 * kPeakChains * width flops per round; a few ms per thread.
  const int64_t fma_iters = 20000000 / std::max(1, kt.width);
  const double fma_flops = 2.0 * detail::kPeakChains * kt.width * static_cast<double>(fma_iters);
  // Exponentials: 4096 values (16 or 32 KiB, in and out in L1), repeated.
  constexpr int64_t kM = 4096;
  const int64_t exp_reps = 10000;
  std::vector<std::vector<T>> xs(p.threads, std::vector<T>(kM)), ys(p.threads, std::vector<T>(kM));
  for (auto& x : xs)
    for (int64_t i = 0; i < kM; ++i) x[i] = static_cast<T>(-20.0 * static_cast<double>(i) / kM);
  for (int r = 0; r < rounds; ++r) {
    const double tf = timed_on_all(
        p.threads, [&](int64_t t) { sink[t] += static_cast<double>(kt.peak_fma(fma_iters, static_cast<T>(t))); });
    p.flops_per_s = std::max(p.flops_per_s, fma_flops * p.threads / tf);
    const double te = timed_on_all(p.threads, [&](int64_t t) {
      for (int64_t k = 0; k < exp_reps; ++k) kt.vexp(kM, xs[t].data(), ys[t].data());
      sink[t] += static_cast<double>(ys[t][kM / 2]);
    });
    p.exps_per_s = std::max(p.exps_per_s, static_cast<double>(kM * exp_reps) * p.threads / te);
  }
  for (double x : sink) g_peak_sink = g_peak_sink + x;
  return p;
}

}  // namespace

MachinePeak measure_peak(bool float64, int rounds, const Tuning& tuning) {
  ASAP_CHECK(rounds >= 1, "measure_peak: rounds must be at least 1, found ", rounds);
  const auto& k = detail::kernels_for(tuning);
  return float64 ? peak_of(detail::table_of<double>(k), rounds) : peak_of(detail::table_of<float>(k), rounds);
}

}  // namespace fast
}  // namespace asap
