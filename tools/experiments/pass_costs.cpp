// What each kind of log-sum-exp pass costs in the fused kernels at one shape:
// Sinkhorn T' = 1..6 (asap::fast::sinkhorn_normalizer, outputs only, as
// deployed), with the row passes on the transposed tile chosen automatically
// (the default) and switched off, timed alternately on one thread (least time
// per operator over ROUNDS rounds of REPS calls). Built and run by
// pass_costs.sh; docs/performance.md, "AVX-512 again".
//
//   pass_costs N D ROUNDS REPS
//
// T' = 1 ends on a row pass, T' = 2 on a column pass, and so on. With the
// transposed path a row pass before the last is a column sweep of the
// transposed tile, so r (a row pass before the last) and c (a column pass
// before the last) do the same work and
//   (T'2 - T'1) - (T'3 - T'2) = r - c + 2 (Cf - Rf) ~ 2 (Cf - Rf),
// where Cf and Rf are the final column and final row passes with the output
// GEMM: what ending on a column pass costs more than ending on a row pass.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "args.h"
#include "fast/fast.h"

namespace {
long positive(const char* s, const char* what) { return positive_arg("pass_costs", s, what); }
}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: pass_costs N D ROUNDS REPS\n");
    return 2;
  }
  const long n = positive(argv[1], "N"), d = positive(argv[2], "D");
  const long rounds = positive(argv[3], "ROUNDS"), reps = positive(argv[4], "REPS");
  at::set_num_threads(1);
  at::manual_seed(0);
  const auto q = at::randn({16, 4, n, d}), k = at::randn({16, 4, n, d}), v = at::randn({16, 4, n, d});
  asap::Convention c;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  constexpr int kT = 6;
  const int modes[2] = {-1, 0};
  double best[2][kT + 1];
  double diff = 0;
  for (auto& m : best) std::fill(m, m + kT + 1, 1e300);
  for (long round = 0; round < rounds; ++round)
    for (int T = 1; T <= kT; ++T) {
      at::Tensor out[2];
      for (int m = 0; m < 2; ++m) {
        asap::fast::Tuning tu;
        tu.transposed_rows = modes[m];
        for (long rep = 0; rep < reps; ++rep) {
          const auto t0 = std::chrono::steady_clock::now();
          auto r = asap::fast::sinkhorn_normalizer(q, k, v, {}, scale, T, c, false, tu);
          const auto t1 = std::chrono::steady_clock::now();
          best[m][T] = std::min(best[m][T], std::chrono::duration<double, std::micro>(t1 - t0).count());
          out[m] = r.O;
        }
      }
      diff = std::max(diff, (out[0] - out[1]).abs().max().item<double>() / out[1].abs().max().item<double>());
    }
  std::printf("n = %ld, d = %ld, B x H = 16 x 4, 1 thread, isa %s, least time of %ld rounds x %ld calls (us)\n", n, d,
              asap::fast::isa_for().c_str(), rounds, reps);
  std::printf("%-22s", "row passes");
  for (int T = 1; T <= kT; ++T) std::printf("   T'=%d", T);
  std::printf("\n");
  for (int m = 0; m < 2; ++m) {
    std::printf("%-22s", m == 0 ? "transposed (default)" : "in place");
    for (int T = 1; T <= kT; ++T) std::printf(" %7.1f", best[m][T]);
    std::printf("\n");
  }
  const double* b = best[0];
  const double pair = ((b[3] - b[1]) + (b[5] - b[3]) + (b[4] - b[2]) + (b[6] - b[4])) / 4;
  std::printf(
      "transposed: a row and a column pass (r + c) %.1f us; ending on a column pass costs %.1f us more than "
      "ending on a row pass ((T'2 - T'1) - (T'3 - T'2)) / 2)\n",
      pair, ((b[2] - b[1]) - (b[3] - b[2])) / 2);
  std::printf("outputs of the two paths: max relative difference %.2e\n", diff);
  return 0;
}
