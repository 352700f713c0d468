// Whether the fused kernels still meet subnormal numbers: the teacher T = 6
// (asap::fast::teacher) and Sinkhorn T' = 4 (asap::fast::sinkhorn_normalizer),
// outputs only, timed alternately with the x86 flush-to-zero and
// denormals-are-zero bits (MXCSR 0x8040) off (the default) and on, on every
// thread of LibTorch's OpenMP team. With subnormals in a pass, the bits make
// the calls faster; without them they change nothing. Built and run by
// ftz_ab.sh; docs/performance.md, "Subnormal exponentials".
//
//   ftz_ab N D THREADS ROUNDS REPS QK_SCALE
//
// q and k are standard normal times QK_SCALE (at 6, most plan entries are
// more than 87 below their row's or column's maximum, so the exponential
// clamps them). Prints the least time of ROUNDS rounds of REPS calls per
// operator and mode.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "args.h"
#include "fast/fast.h"

namespace {
constexpr unsigned kFtzDaz = 0x8040u;

long positive(const char* s, const char* what) { return positive_arg("ftz_ab", s, what); }

// Sets (or clears) the two bits on the calling thread and on every thread of
// the team, then checks that each thread reads them back: at::parallel_for
// over as many items as threads gives each thread one item.
void set_ftz(bool on) {
  auto apply = [on] { _mm_setcsr(on ? (_mm_getcsr() | kFtzDaz) : (_mm_getcsr() & ~kFtzDaz)); };
  apply();
  const int64_t t = at::get_num_threads();
  at::parallel_for(0, t, 1, [&](int64_t, int64_t) { apply(); });
  std::atomic<int> wrong{0};
  at::parallel_for(0, t, 1, [&](int64_t, int64_t) {
    if (((_mm_getcsr() & kFtzDaz) == kFtzDaz) != on) ++wrong;
  });
  if (((_mm_getcsr() & kFtzDaz) == kFtzDaz) != on || wrong.load() != 0) {
    std::fprintf(stderr, "ftz_ab: could not set the MXCSR bits on every thread\n");
    std::exit(1);
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: ftz_ab N D THREADS ROUNDS REPS QK_SCALE\n");
    return 2;
  }
  const long n = positive(argv[1], "N"), d = positive(argv[2], "D"), threads = positive(argv[3], "THREADS");
  const long rounds = positive(argv[4], "ROUNDS"), reps = positive(argv[5], "REPS");
  char* end = nullptr;
  const double qk = std::strtod(argv[6], &end);
  if (!*argv[6] || *end || !(qk > 0) || !std::isfinite(qk)) {
    std::fprintf(stderr, "ftz_ab: expected QK_SCALE as a positive number, found '%s'\n", argv[6]);
    return 2;
  }
  at::set_num_threads(static_cast<int>(threads));
  at::manual_seed(0);
  const auto q = at::randn({16, 4, n, d}) * qk, k = at::randn({16, 4, n, d}) * qk, v = at::randn({16, 4, n, d});
  const asap::Convention c;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const char* names[2] = {"teacher T = 6", "Sinkhorn T' = 4"};
  const std::function<at::Tensor()> ops[2] = {
      [&] { return asap::fast::teacher(q, k, v, at::Tensor(), scale, 6, c, false, {}, false).O; },
      [&] { return asap::fast::sinkhorn_normalizer(q, k, v, at::Tensor(), scale, 4, c).O; }};
  double best[2][2] = {{1e300, 1e300}, {1e300, 1e300}};
  double diff = 0;
  for (long round = 0; round < rounds; ++round)
    for (int o = 0; o < 2; ++o) {
      at::Tensor out[2];
      for (int mode = 0; mode < 2; ++mode) {
        set_ftz(mode == 1);
        out[mode] = ops[o]();  // warm-up
        const auto t0 = std::chrono::steady_clock::now();
        for (long r = 0; r < reps; ++r) out[mode] = ops[o]();
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
        best[o][mode] = std::min(best[o][mode], us);
      }
      set_ftz(false);
      diff = std::max(diff, (out[0] - out[1]).abs().max().item<double>());
    }
  std::printf(
      "n = %ld, d = %ld, B x H = 16 x 4, %ld thread(s), q and k x %g, isa %s, least time of %ld rounds x %ld calls "
      "(us)\n",
      n, d, threads, qk, asap::fast::isa_for().c_str(), rounds, reps);
  std::printf("%-16s %10s %10s %8s\n", "operator", "default", "FTZ+DAZ", "ratio");
  for (int o = 0; o < 2; ++o)
    std::printf("%-16s %10.1f %10.1f %8.3f\n", names[o], best[o][0], best[o][1], best[o][1] / best[o][0]);
  std::printf("outputs of the two modes: max absolute difference %.3g\n", diff);
  return 0;
}
