// The fused CPU fast path (fast/fast.h) against the ATen reference path:
// teacher, features, compiled operator and ESP attention, on random inputs
// with and without padding, both mask conventions, every instruction set the
// CPU has, heads-parallel and within-head strategies, stored and recomputed
// score tiles.
#include <ATen/ATen.h>

#include <ATen/Parallel.h>
#include <thread>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "asap/error.h"
#include "asap/features.h"
#include "asap/operator.h"
#include "asap/runtime.h"
#include "fast/common.h"
#include "fast/engine.h"
#include "fast/fast.h"
#include "fast/sort.h"
#include "test_util.h"

using asap_test::rel_err;
using asap_test::Threads;
using asap_test::tol_of;

namespace {

// The kernel tables of one instruction set (asap::fast::available_isas()).
const asap::fast::detail::Kernels& kernels_of(const std::string& isa) {
  asap::fast::Tuning t;
  t.isa = isa;
  return asap::fast::detail::kernels_for(t);
}

at::Tensor make_mask(int64_t B, int64_t n, int seed) {
  auto m = at::ones({B, n}, at::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t keep = std::max<int64_t>(1, n - (b * 7 + seed) % std::max<int64_t>(1, n));
    if (keep < n) m[b].slice(0, keep).fill_(false);
  }
  // An interior hole too, when there is room.
  if (n >= 6) m[0][n / 3] = false;
  // And a left-padded sequence: its keys are one run that does not start at
  // token 0 (the engine reads such runs of q, k, v and O in place).
  if (B >= 2 && n >= 3) {
    m[1].fill_(true);
    m[1].slice(0, 0, 1 + n / 4).fill_(false);
  }
  return m;
}

struct Config {
  std::string name;
  asap::fast::Tuning tuning;
  int threads = 1;  // at::set_num_threads for the call (LibTorch may default to 1)
};

std::vector<Config> configs() {
  std::vector<Config> out;
  for (const auto& isa : asap::fast::available_isas()) {
    asap::fast::Tuning t;
    t.isa = isa;
    out.push_back({isa + "/auto/1 thread", t, 1});
  }
  // Row passes before the last on the transposed tile: automatic above (on
  // every ISA from one vector of rows to 100 keys), at every length here (n = 1,
  // 2 and 130 too), and never (row_lse in place at n = 16-64; its kernel on
  // every ISA: "pack_b and row_lse against their definitions").
  asap::fast::Tuning t;
  t.transposed_rows = 1;
  out.push_back({"transposed rows/1 thread", t, 1});
  t.transposed_rows = 0;
  out.push_back({"rows in place/1 thread", t, 1});
  t.transposed_rows = -1;
  out.push_back({"auto/3 threads", t, 3});
  t.strategy = asap::fast::Strategy::kWithinHead;
  t.transposed_rows = 1;  // the transposed row pass split over threads
  out.push_back({"within-head/store/transposed rows/2 threads", t, 2});
  t.transposed_rows = -1;
  out.push_back({"within-head/store/2 threads", t, 2});
  t.store_scores = 0;
  t.chunk_rows = 7;
  out.push_back({"within-head/recompute/3 threads", t, 3});
  t.strategy = asap::fast::Strategy::kHeadParallel;
  out.push_back({"heads/recompute/2 threads", t, 2});
  t.isa = "generic";
  out.push_back({"generic/heads/recompute/1 thread", t, 1});
  return out;
}

}  // namespace

TEST_CASE("fast: exponential kernels are accurate on every instruction set") {
  auto xf = at::linspace(-87.0, 88.0, 20001, at::kDouble);
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    auto x32 = xf.to(at::kFloat).contiguous();
    auto y32 = at::empty_like(x32);
    K.f32.vexp(x32.numel(), x32.data_ptr<float>(), y32.data_ptr<float>());
    auto ref32 = at::exp(x32.to(at::kDouble));
    CHECK(((y32.to(at::kDouble) - ref32).abs() / ref32).max().item<double>() < 3e-7);
    auto x64 = at::linspace(-700.0, 700.0, 20001, at::kDouble);
    auto y64 = at::empty_like(x64);
    K.f64.vexp(x64.numel(), x64.data_ptr<double>(), y64.data_ptr<double>());
    auto ref64 = at::exp(x64);
    CHECK(((y64 - ref64).abs() / ref64).max().item<double>() < 1e-15);
    // -inf gives a (tiny) non-negative number, never NaN.
    float ninf = -std::numeric_limits<float>::infinity(), out = -1;
    K.f32.vexp(1, &ninf, &out);
    CHECK(out >= 0.0f);
    CHECK(out < 1e-37f);
    // Never a subnormal: every entry of a plan far below its row's or
    // column's maximum is clamped, and a subnormal there costs a microcode
    // assist in every sum and product it enters (with the clamp at
    // -87.33654475 every clamped input gave 1.1754907e-38, just under
    // FLT_MIN, and every fused operator took 5-11% more time at n = 17-50).
    // Inputs from -inf up through the clamp and the first binades above it.
    auto xs = at::cat({at::full({1}, -std::numeric_limits<double>::infinity(), at::kDouble),
                       at::linspace(-1000.0, -85.0, 200001, at::kDouble)})
                  .to(at::kFloat)
                  .contiguous();
    auto ys = at::empty_like(xs);
    K.f32.vexp(xs.numel(), xs.data_ptr<float>(), ys.data_ptr<float>());
    CHECK(ys.min().item<float>() >= std::numeric_limits<float>::min());
    auto xd = at::linspace(-1000.0, -700.0, 20001, at::kDouble);
    auto yd = at::empty_like(xd);
    K.f64.vexp(xd.numel(), xd.data_ptr<double>(), yd.data_ptr<double>());
    CHECK(yd.min().item<double>() >= std::numeric_limits<double>::min());
  }
}

TEST_CASE("fast: all_finite finds one NaN or infinity anywhere, on every instruction set") {
  // The runtime's NaN-propagation pass over q, k, v: a value missed in a
  // vector block, the unrolled part or the tail would let NaN in give a
  // finite answer out.
  for (const auto& isa : asap::fast::available_isas()) {
    const auto& K = kernels_of(isa);
    for (int64_t n : {1, 7, 16, 63, 64, 65, 200}) {
      CAPTURE(isa);
      CAPTURE(n);
      // Finite, including the extremes: zeros, subnormals, the largest values.
      std::vector<float> xf(n, 1.5f);
      std::vector<double> xd(n, -2.5);
      const float ef[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max()};
      const double ed[] = {0.0, -0.0, std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::max(),
                           -std::numeric_limits<double>::max()};
      for (int64_t i = 0; i < n; ++i) xf[i] = i % 3 ? xf[i] : ef[i % 5], xd[i] = i % 3 ? xd[i] : ed[i % 5];
      CHECK(K.f32.all_finite(xf.data(), n));
      CHECK(K.f64.all_finite(xd.data(), n));
      for (int64_t i : {int64_t(0), n / 2, n - 1}) {
        for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
          auto yf = xf;
          auto yd = xd;
          yf[i] = static_cast<float>(bad);
          yd[i] = bad;
          CHECK_FALSE(K.f32.all_finite(yf.data(), n));
          CHECK_FALSE(K.f64.all_finite(yd.data(), n));
        }
      }
    }
  }
  auto q = at::randn({2, 3, 5, 4});
  CHECK(asap::fast::all_finite(q));
  q[1][2][4][3] = std::nan("");
  CHECK_FALSE(asap::fast::all_finite(q));
  CHECK_FALSE(asap::fast::all_finite(q.transpose(0, 1)));  // not contiguous: the ATen path
}

TEST_CASE("fast: map_tail is the slice-free map's dual and centered phi on every instruction set") {
  // x = ca alpha + b1 f1 + b3 f3, f = (x - alpha) / eps, phi = x - mean(x):
  // a lane block, the tail or a dropped term would change f or phi.
  for (const auto& isa : asap::fast::available_isas()) {
    const auto& K = kernels_of(isa).f64;
    for (int64_t n : {1, 5, 16, 17, 33}) {
      for (int terms = 0; terms < 4; ++terms) {
        CAPTURE(isa);
        CAPTURE(n);
        CAPTURE(terms);
        std::vector<double> alpha(n), f1(n), f3(n), x(n), phi(n), f(n), f_only(n);
        for (int64_t i = 0; i < n; ++i) {
          alpha[i] = 0.5 + 0.25 * static_cast<double>((i * 7) % 11);
          f1[i] = -1.0 + 0.125 * static_cast<double>((i * 5) % 13);
          f3[i] = 2.0 - 0.375 * static_cast<double>((i * 3) % 7);
        }
        const double* p1 = (terms & 1) ? f1.data() : nullptr;
        const double* p3 = (terms & 2) ? f3.data() : nullptr;
        const double ca = 0.75, b1 = -0.5, b3 = 1.25, inv_eps = 2.0;
        K.map_tail(n, alpha.data(), p1, p3, nullptr, ca, b1, b3, inv_eps, x.data(), phi.data(), f.data());
        K.map_tail(n, alpha.data(), p1, p3, nullptr, ca, b1, b3, inv_eps, x.data(), nullptr, f_only.data());
        std::vector<double> want(n);
        double mean = 0;
        for (int64_t i = 0; i < n; ++i) {
          want[i] = ca * alpha[i] + (p1 ? b1 * f1[i] : 0.0) + (p3 ? b3 * f3[i] : 0.0);
          mean += want[i] / static_cast<double>(n);
        }
        for (int64_t i = 0; i < n; ++i) {
          CHECK(f[i] == doctest::Approx((want[i] - alpha[i]) * inv_eps).epsilon(1e-12));
          CHECK(f_only[i] == f[i]);  // the dual does not depend on whether phi is asked for
          CHECK(phi[i] == doctest::Approx(want[i] - mean).epsilon(1e-12).scale(1.0));
        }
      }
    }
  }
}

namespace {
// col_stats of one table against float64 loops over each column's rows.
template <class T>
void check_col_stats(const asap::fast::detail::KernelTable<T>& K, double tol) {
  const int64_t ld = 96;  // rows readable up to roundup(nc, width) for nc <= 70
  for (int64_t rows : {1, 2, 3, 16, 17, 40})
    for (int64_t nc : {1, 2, 5, 8, 15, 16, 17, 33, 64, 70}) {
      CAPTURE(rows);
      CAPTURE(nc);
      const int64_t out = ld + 1;  // whole vectors up to roundup(nc, width), then a sentinel
      std::vector<T> M(rows * ld), mx(out, T(-7)), mean(out), sd(out), y(out, T(-7));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < ld; ++c)  // an offset per column
          M[r * ld + c] = static_cast<T>(3.0 * c - 20 + std::sin(0.37 * (c * 131 + r * 17)) * (1 + r % 5));
      const T w[3] = {T(0.5), T(-1.25), T(2.0)};
      K.col_stats(rows, nc, M.data(), ld, nullptr, mx.data(), mean.data(), sd.data(), nullptr, nullptr, w, nullptr,
                  y.data());
      for (int64_t c = 0; c < nc; ++c) {
        CAPTURE(c);
        double m = -1e300, sum = 0, sq = 0;
        for (int64_t r = 0; r < rows; ++r) m = std::max(m, static_cast<double>(M[r * ld + c])), sum += M[r * ld + c];
        const double mu = sum / rows;
        for (int64_t r = 0; r < rows; ++r) sq += (M[r * ld + c] - mu) * (M[r * ld + c] - mu);
        const double sdv = std::sqrt(sq / rows);
        CHECK(mx[c] == static_cast<T>(m));
        CHECK(mean[c] == doctest::Approx(mu).epsilon(tol).scale(20));
        CHECK(sd[c] == doctest::Approx(sdv).epsilon(tol).scale(20));
        CHECK(y[c] == doctest::Approx(0.5 * m - 1.25 * mu + 2.0 * sdv).epsilon(tol).scale(50));
      }
      CHECK(mx[ld] == T(-7));  // nothing past roundup(nc, width) <= ld
      CHECK(y[ld] == T(-7));
    }
}

// col_stats with a shift (both sets of statistics in one sweep) and
// col_sums of one table against float64 loops.
template <class T>
void check_col_stats_shifted(const asap::fast::detail::KernelTable<T>& K, double tol) {
  const int64_t ld = 96;
  for (int64_t rows : {1, 2, 3, 16, 17, 40})
    for (int64_t nc : {1, 2, 5, 8, 15, 16, 17, 33, 64, 70}) {
      CAPTURE(rows);
      CAPTURE(nc);
      const int64_t out = ld + 1;
      std::vector<T> M(rows * ld), shift(rows), mx(out, T(-7)), var(out, T(-7)), y(out, T(-7)), sums(out, T(-7));
      std::vector<T> rmx(out, T(-7)), rmean(out, T(-7)), rsd(out, T(-7));  // the unshifted statistics
      for (int64_t r = 0; r < rows; ++r) {
        shift[r] = static_cast<T>(std::cos(0.7 * r) * 5 + r);  // a shift per row, as large as the spread
        for (int64_t c = 0; c < ld; ++c)
          M[r * ld + c] = static_cast<T>(3.0 * c - 20 + std::sin(0.37 * (c * 131 + r * 17)) * (1 + r % 5));
      }
      for (int64_t c = 0; c < ld; ++c) sums[c] = static_cast<T>(c % 3);
      const T w[3] = {T(0.75), T(0.5), T(-2.0)}, wc[2] = {T(0.5), T(-1.25)};
      K.col_stats(rows, nc, M.data(), ld, shift.data(), rmx.data(), rmean.data(), rsd.data(), mx.data(), var.data(), w,
                  wc, y.data());
      K.col_sums(rows, nc, M.data(), ld, sums.data());
      for (int64_t c = 0; c < nc; ++c) {
        CAPTURE(c);
        double m = -1e300, sum = 0, sq = 0, raw = 0, rm = -1e300, rsq = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const double x = static_cast<double>(M[r * ld + c]) - static_cast<double>(shift[r]);
          m = std::max(m, x), sum += x, raw += M[r * ld + c], rm = std::max(rm, static_cast<double>(M[r * ld + c]));
        }
        const double mu = sum / rows, rmu = raw / rows;
        for (int64_t r = 0; r < rows; ++r) {
          const double x = static_cast<double>(M[r * ld + c]) - static_cast<double>(shift[r]);
          sq += (x - mu) * (x - mu), rsq += (M[r * ld + c] - rmu) * (M[r * ld + c] - rmu);
        }
        const double rsdv = std::sqrt(rsq / rows);
        CHECK(mx[c] == doctest::Approx(m).epsilon(tol).scale(20));
        CHECK(var[c] == doctest::Approx(sq / rows).epsilon(tol).scale(400));
        // The unshifted statistics of the same sweep, as col_stats without a shift gives them.
        CHECK(rmx[c] == static_cast<T>(rm));
        CHECK(rmean[c] == doctest::Approx(rmu).epsilon(tol).scale(20));
        CHECK(rsd[c] == doctest::Approx(rsdv).epsilon(tol).scale(20));
        CHECK(y[c] == doctest::Approx(0.75 * rm + 0.5 * rmu - 2.0 * rsdv + 0.5 * m - 1.25 * (sq / rows))
                          .epsilon(tol)
                          .scale(1000));
        CHECK(sums[c] == doctest::Approx(c % 3 + raw).epsilon(tol).scale(20.0 * rows));
      }
      CHECK(mx[ld] == T(-7));  // nothing past roundup(nc, width) <= ld
      CHECK(y[ld] == T(-7));
      CHECK(sums[ld] == T(-7));
    }
}

// line_stats: one column's statistics from a contiguous line (the rows of
// S' past the transposed tile's last whole vector of lanes), with and
// without the shift, against float64 loops; counts below, at and past the
// vector widths (whole vectors, a scalar rest, no vector at all).
template <class T>
void check_line_stats(const asap::fast::detail::KernelTable<T>& K, double tol) {
  for (int64_t count : {1, 2, 3, 7, 8, 9, 15, 16, 17, 18, 33, 40, 64, 70}) {
    CAPTURE(count);
    std::vector<T> x(count), shift(count);
    for (int64_t i = 0; i < count; ++i) {
      shift[i] = static_cast<T>(std::cos(0.7 * i) * 5 + i);
      x[i] = static_cast<T>(2.0 * i - 20 + std::sin(0.37 * (i * 131 + 17)) * (1 + i % 5));
    }
    double m = -1e300, raw = 0, mz = -1e300, sz = 0;
    for (int64_t i = 0; i < count; ++i) {
      const double z = static_cast<double>(x[i]) - static_cast<double>(shift[i]);
      m = std::max(m, static_cast<double>(x[i])), raw += x[i], mz = std::max(mz, z), sz += z;
    }
    const double mu = raw / count, muz = sz / count;
    double sq = 0, sqz = 0;
    for (int64_t i = 0; i < count; ++i) {
      const double z = static_cast<double>(x[i]) - static_cast<double>(shift[i]);
      sq += (x[i] - mu) * (x[i] - mu), sqz += (z - muz) * (z - muz);
    }
    const double sdv = std::sqrt(sq / count), varz = sqz / count;
    const T w[3] = {T(0.75), T(0.5), T(-2.0)}, wc[2] = {T(0.5), T(-1.25)};
    for (bool shifted : {false, true}) {
      CAPTURE(shifted);
      T mx = T(-7), mean = T(-7), sd = T(-7), mxc = T(-7), var = T(-7), y = T(-7);
      K.line_stats(count, x.data(), shifted ? shift.data() : nullptr, &mx, &mean, &sd, shifted ? &mxc : nullptr,
                   shifted ? &var : nullptr, w, shifted ? wc : nullptr, &y);
      CHECK(mx == static_cast<T>(m));
      CHECK(mean == doctest::Approx(mu).epsilon(tol).scale(20));
      CHECK(sd == doctest::Approx(sdv).epsilon(tol).scale(20));
      double ye = 0.75 * m + 0.5 * mu - 2.0 * sdv;
      if (shifted) {
        CHECK(mxc == doctest::Approx(mz).epsilon(tol).scale(20));
        CHECK(var == doctest::Approx(varz).epsilon(tol).scale(400));
        ye += 0.5 * mz - 1.25 * varz;
      } else {
        CHECK(mxc == T(-7));  // not written without a shift
        CHECK(var == T(-7));
      }
      CHECK(y == doctest::Approx(ye).epsilon(tol).scale(1000));
    }
  }
}
}  // namespace

TEST_CASE("fast: line_stats is col_stats of one contiguous column on every instruction set") {
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    check_line_stats(kernels_of(isa).f64, 1e-12);
    check_line_stats(kernels_of(isa).f32, 2e-5);
  }
}

TEST_CASE("fast: col_stats with a shift and col_sums against float64 loops on every instruction set") {
  // The centered_stats columns: each row of the transposed tile less its
  // key's column mean (the shift), and the column sums that give the means.
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    check_col_stats_shifted(kernels_of(isa).f64, 1e-12);
    check_col_stats_shifted(kernels_of(isa).f32, 2e-5);
  }
}

TEST_CASE("fast: col_stats is each column's max, mean and standard deviation on every instruction set") {
  // The score statistics of each row, taken on the transposed tile: vector
  // blocks of 1-4 columns and the lanes past nc.
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    check_col_stats(kernels_of(isa).f64, 1e-12);
    check_col_stats(kernels_of(isa).f32, 2e-5);
  }
}

namespace {
// stats_map: the slice-free statistics map's dual of one head in one
// kernel, against float64 loops over each column's values. The columns
// past nc - lines hold other values in M than in their lines (and the lines
// before them other values than M), so reading the wrong one fails; f past
// nc keeps its sentinel.
template <class T>
void check_stats_map(const asap::fast::detail::KernelTable<T>& K, double tol) {
  const int64_t ld = 96, ldl = 45;  // M's rows readable up to roundup(nc, width) for nc <= 70
  for (int64_t rows : {1, 2, 3, 16, 17, 40})
    for (int64_t nc : {1, 2, 5, 8, 15, 16, 17, 33, 64, 70})
      for (int64_t lines : {int64_t(0), int64_t(1), nc % 8, nc})
        for (bool shifted : {false, true}) {
          if (lines > nc) continue;
          CAPTURE(rows);
          CAPTURE(nc);
          CAPTURE(lines);
          CAPTURE(shifted);
          const int64_t nm = nc - lines;
          std::vector<T> M(rows * ld), L(nc * ldl), shift(rows), alpha(nc), f(nc + 1, T(-7));
          const auto value = [](int64_t r, int64_t c) {
            return 3.0 * c - 20 + std::sin(0.37 * (c * 131 + r * 17)) * (1 + r % 5);
          };
          for (int64_t r = 0; r < rows; ++r) {
            shift[r] = static_cast<T>(std::cos(0.7 * r) * 5 + r);
            for (int64_t c = 0; c < ld; ++c) M[r * ld + c] = static_cast<T>(c < nm ? value(r, c) : 1e3 + r);
          }
          for (int64_t c = 0; c < nc; ++c) {
            alpha[c] = static_cast<T>(0.5 + 0.25 * static_cast<double>((c * 7) % 11));
            for (int64_t r = 0; r < rows; ++r) L[c * ldl + r] = static_cast<T>(c >= nm ? value(r, c) : -1e3 - r);
          }
          const T w[3] = {T(0.75), T(0.5), T(-2.0)}, wc[2] = {T(0.5), T(-1.25)};
          const T ca = T(0.625), inv_eps = T(2.0);
          K.stats_map(rows, nc, M.data(), ld, lines, L.data(), ldl, shifted ? shift.data() : nullptr, w,
                      shifted ? wc : nullptr, alpha.data(), ca, inv_eps, f.data());
          for (int64_t c = 0; c < nc; ++c) {
            CAPTURE(c);
            double m = -1e300, sum = 0, mz = -1e300, sz = 0;
            for (int64_t r = 0; r < rows; ++r) {
              const double x = static_cast<T>(value(r, c)), z = x - static_cast<double>(shift[r]);
              m = std::max(m, x), sum += x, mz = std::max(mz, z), sz += z;
            }
            const double mu = sum / rows, muz = sz / rows;
            double sq = 0, sqz = 0;
            for (int64_t r = 0; r < rows; ++r) {
              const double x = static_cast<T>(value(r, c)), z = x - static_cast<double>(shift[r]);
              sq += (x - mu) * (x - mu), sqz += (z - muz) * (z - muz);
            }
            double y = 0.75 * m + 0.5 * mu - 2.0 * std::sqrt(sq / rows);
            if (shifted) y += 0.5 * mz - 1.25 * (sqz / rows);
            const double a = alpha[c];
            CHECK(f[c] == doctest::Approx((0.625 * a + y - a) * 2.0).epsilon(tol).scale(2000));
          }
          CHECK(f[nc] == T(-7));  // nothing past f[nc - 1]
        }
}
}  // namespace

TEST_CASE("fast: stats_map is the statistics map's dual from the tile and its lines on every instruction set") {
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    check_stats_map(kernels_of(isa).f64, 1e-12);
    check_stats_map(kernels_of(isa).f32, 2e-5);
  }
}

TEST_CASE("fast: row_sqnorm is (s/2) ||q_r||^2 for the listed rows on every instruction set") {
  // Rows in blocks of the float64 vector width (and, for float32 with d a
  // multiple of the float32 width up to 16 vectors, of the float32 width)
  // share one joint reduction (lane i = row i): a wrong shuffle or a wrong
  // row order would swap or mix rows. The float32 blocks are compiled per
  // vector count (1 to 8): d = 8, 16, 24, 32, 40, 48, 56 and 64 are 1 to 8
  // vectors of AVX2, and 16, 32, 48, 64, 80, 96, 112 and 128 of AVX-512 (two
  // chains past 4 vectors, an odd count with a last vector of its own); 9 to
  // 16 vectors take a loop (72, 80, 96, 112 and 128 with AVX2, 144 with
  // AVX-512); 136 and 144, 17 and 18 vectors of AVX2, are past it.
  at::manual_seed(5);
  for (const auto& isa : asap::fast::available_isas()) {
    const auto& K = kernels_of(isa);
    for (int64_t d : {1, 2, 7, 8, 16, 17, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128, 136, 144}) {
      for (int64_t count : {1, 3, 8, 9, 17, 19, 33}) {
        CAPTURE(isa);
        CAPTURE(d);
        CAPTURE(count);
        const int64_t n = count + 5;
        auto q64 = at::randn({n, d}, at::kDouble);
        // Elements by pointer: .item() per element made this case 49 s under ASan.
        const double* x64 = q64.data_ptr<double>();
        std::vector<int64_t> rows;
        for (int64_t r = 0; r < count; ++r) rows.push_back((r * 7 + 3) % n);  // not in order
        auto expect = [&](int64_t r) {
          double s = 0;
          for (int64_t c = 0; c < d; ++c) s += x64[rows[r] * d + c] * x64[rows[r] * d + c];
          return 0.5 * 0.3 * s;
        };
        std::vector<double> o64(count);
        K.f64.row_sqnorm(count, rows.data(), q64.data_ptr<double>(), d, 0.15, o64.data());
        auto q32 = q64.to(at::kFloat).contiguous();
        std::vector<float> o32(count);
        K.f32.row_sqnorm(count, rows.data(), q32.data_ptr<float>(), d, 0.15f, o32.data());
        for (int64_t r = 0; r < count; ++r) {
          const double e = expect(r);
          CHECK(std::abs(o64[r] - e) <= 1e-13 * e);
          double e32 = 0;  // from the float32 inputs
          const float* x32 = q32.data_ptr<float>() + rows[r] * d;
          for (int64_t c = 0; c < d; ++c) e32 += double(x32[c]) * x32[c];
          CHECK(std::abs(o32[r] - 0.15 * e32) <= 1e-6 * 0.15 * e32);
        }
        // rows == nullptr: the first `count` rows, contiguous (every head of
        // an unmasked batch in one call), the same values as listing them.
        std::vector<int64_t> first(count);
        std::iota(first.begin(), first.end(), int64_t(0));
        std::vector<double> c64(count), l64(count);
        K.f64.row_sqnorm(count, nullptr, q64.data_ptr<double>(), d, 0.15, c64.data());
        K.f64.row_sqnorm(count, first.data(), q64.data_ptr<double>(), d, 0.15, l64.data());
        std::vector<float> c32(count), l32(count);
        K.f32.row_sqnorm(count, nullptr, q32.data_ptr<float>(), d, 0.15f, c32.data());
        K.f32.row_sqnorm(count, first.data(), q32.data_ptr<float>(), d, 0.15f, l32.data());
        CHECK(c64 == l64);
        CHECK(c32 == l32);
        for (int64_t r = 0; r < count; ++r) {
          double e = 0;
          for (int64_t c = 0; c < d; ++c) e += x64[r * d + c] * x64[r * d + c];
          CHECK(std::abs(c64[r] - 0.15 * e) <= 1e-13 * 0.15 * e);
        }
      }
    }
  }
}

TEST_CASE("fast: the peak probe does the multiply-adds it counts, and measure_peak reports rates") {
  // peak_fma(iters, seed): kPeakChains chains x width lanes of x = x * a + b,
  // chain c starting at seed + c; the result is the sum over chains and lanes.
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    const int64_t iters = 1000;
    auto expect = [&](double seed, double a, double b, int width) {
      double sum = 0;
      for (int c = 0; c < asap::fast::detail::kPeakChains; ++c) {
        double x = seed + c;
        for (int64_t i = 0; i < iters; ++i) x = x * a + b;
        sum += width * x;
      }
      return sum;
    };
    const double e64 = expect(0.5, 0.999999, 1e-7, K.f64.width);
    CHECK(std::abs(K.f64.peak_fma(iters, 0.5) - e64) < 1e-9 * std::abs(e64));
    const double e32 = expect(0.5, static_cast<double>(0.999999f), static_cast<double>(1e-7f), K.f32.width);
    CHECK(std::abs(K.f32.peak_fma(iters, 0.5f) - e32) < 1e-3 * std::abs(e32));  // float rounding over 1000 steps
    asap::fast::Tuning t;
    t.isa = isa;
    const auto pk = asap::fast::measure_peak(false, 1, t);
    CHECK(pk.isa == isa);
    CHECK(pk.threads == at::get_num_threads());
    // Rates only: their size depends on the machine and its load, so no
    // threshold on them decides this test.
    CHECK(std::isfinite(pk.flops_per_s));
    CHECK(pk.flops_per_s > 0);
    CHECK(std::isfinite(pk.exps_per_s));
    CHECK(pk.exps_per_s > 0);
  }
  CHECK_THROWS_AS(asap::fast::measure_peak(false, 0), asap::Error);
}

namespace {

// The kernels' pack_b against its definition: panel p holds alpha * B[j][k]
// at out[p * K * NR + k * NR + (j - p * NR)], zeros up to the next whole
// vector after the last column, nothing read or written beyond.
template <class T>
void check_pack_b(const asap::fast::detail::KernelTable<T>& kt, int64_t N, int64_t K) {
  const int64_t NR = kt.nt_nr, W = kt.width, ldb = K + 3;
  const int64_t panels = (N + NR - 1) / NR;
  std::vector<T> B(static_cast<size_t>(N * ldb));
  for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<T>(std::sin(0.37 * static_cast<double>(i)) * 3.0);
  std::vector<T> out(static_cast<size_t>(panels * K * NR), std::numeric_limits<T>::quiet_NaN());
  const T alpha = static_cast<T>(0.5);
  kt.pack_b(N, K, B.data(), ldb, alpha, out.data());
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t cols = std::min(NR, N - p * NR), wcols = std::min(NR, (cols + W - 1) / W * W);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t jj = 0; jj < wcols; ++jj) {
        const T want = jj < cols ? alpha * B[static_cast<size_t>((p * NR + jj) * ldb + k)] : T(0);
        const T got = out[static_cast<size_t>(p * K * NR + k * NR + jj)];
        if (got != want) {
          FAIL_CHECK("pack_b N=" << N << " K=" << K << " panel " << p << " k " << k << " col " << jj << ": " << got
                                 << " != " << want);
          return;
        }
      }
  }
}

// row_lse against a float64 log-sum-exp: lse[r] = LSE_j(S[r,j] + add[j]);
// with E also E[r,j] = exp(S + add - max_j(S[r,.] + add)) and z[r] = sum_j E[r,j]. S rows
// are padded to whole panels, as the engine's tiles are.
template <class T>
void check_row_lse(const asap::fast::detail::KernelTable<T>& kt, int64_t rows, int64_t nc, bool some_neg_inf,
                   double tol) {
  const int64_t lds = (nc + kt.nt_nr - 1) / kt.nt_nr * kt.nt_nr;
  std::vector<T> S(static_cast<size_t>(rows * lds), T(0)), add(static_cast<size_t>(nc));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < nc; ++j) S[r * lds + j] = static_cast<T>(4.0 * std::sin(1.3 * r + 0.71 * j));
  for (int64_t j = 0; j < nc; ++j)
    add[j] = some_neg_inf && j % 5 == 1 ? -std::numeric_limits<T>::infinity() : static_cast<T>(std::cos(0.9 * j));
  std::vector<T> lse(rows), lse2(rows), z(rows), E(S.size());
  kt.row_lse(rows, nc, S.data(), lds, add.data(), lse.data(), nullptr, 0, nullptr);
  kt.row_lse(rows, nc, S.data(), lds, add.data(), lse2.data(), E.data(), lds, z.data());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < nc; ++j) m = std::max(m, static_cast<double>(S[r * lds + j]) + add[j]);
    for (int64_t j = 0; j < nc; ++j) sum += std::exp(static_cast<double>(S[r * lds + j]) + add[j] - m);
    const double want = m + std::log(sum);
    CAPTURE(nc);
    CAPTURE(r);
    CHECK(std::abs(static_cast<double>(lse[r]) - want) <= tol * std::max(1.0, std::abs(want)));
    CHECK(std::abs(static_cast<double>(lse2[r]) - want) <= tol * std::max(1.0, std::abs(want)));
    double esum = 0;
    for (int64_t j = 0; j < nc; ++j) {
      const double e = std::exp(static_cast<double>(S[r * lds + j]) + add[j] - m);
      CHECK(std::abs(static_cast<double>(E[r * lds + j]) - e) <= tol * std::max(1e-30, e) + 1e-30);
      esum += static_cast<double>(E[r * lds + j]);
    }
    CHECK(std::abs(esum - static_cast<double>(z[r])) <= tol * esum);
  }
}

// col_line against its definition: mx the largest x + add (the same sum in
// T, so exactly), sm the sum of exp(x + add - mx) against float64, e those
// exponentials at stride lde (the column of a tile) with the entries between
// untouched; a line of -inf only gives -inf, 0 and zeros.
template <class T>
void check_col_line(const asap::fast::detail::KernelTable<T>& kt, int64_t count, bool all_neg_inf, double tol) {
  const T ninf = -std::numeric_limits<T>::infinity();
  const int64_t lde = 3;
  std::vector<T> x(static_cast<size_t>(count)), add(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    x[i] = static_cast<T>(4.0 * std::sin(1.7 * static_cast<double>(i) + 0.3));
    add[i] = all_neg_inf ? ninf : static_cast<T>(std::cos(0.9 * static_cast<double>(i)));
  }
  std::vector<T> e(static_cast<size_t>(count * lde), T(-7));
  T mx = 0, sm = -1, mx2 = 0, sm2 = -1;
  kt.col_line(count, x.data(), add.data(), &mx, &sm, nullptr, 0);
  kt.col_line(count, x.data(), add.data(), &mx2, &sm2, e.data(), lde);
  CAPTURE(count);
  CAPTURE(all_neg_inf);
  T want_m = ninf;
  for (int64_t i = 0; i < count; ++i) want_m = std::max(want_m, static_cast<T>(x[i] + add[i]));
  CHECK(mx == want_m);
  CHECK(mx2 == want_m);
  double want_z = 0;
  int wrong = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double y = all_neg_inf ? 0.0 : std::exp(static_cast<double>(x[i] + add[i]) - static_cast<double>(want_m));
    want_z += y;
    if (!(std::abs(static_cast<double>(e[i * lde]) - y) <= tol * std::max(1e-30, y) + 1e-30)) ++wrong;
    for (int64_t s = 1; s < lde; ++s)
      if (e[i * lde + s] != T(-7)) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(std::abs(static_cast<double>(sm) - want_z) <= tol * std::max(1.0, want_z));
  CHECK(sm2 == sm);
}

}  // namespace

TEST_CASE("fast: col_line against its definition on every instruction set") {
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    for (int64_t count = 1; count <= 70; ++count) {
      check_col_line(K.f32, count, false, 2e-6);
      check_col_line(K.f64, count, false, 1e-13);
    }
    check_col_line(K.f32, 17, true, 0);
    check_col_line(K.f64, 2, true, 0);
  }
}

TEST_CASE("fast: pack_b and row_lse against their definitions on every instruction set") {
  // Covers the register transposes of pack_b (whole W x W blocks, the last
  // partial block of columns with zero rows past N, one or two keys past the
  // full blocks by shuffles: n = 17, 33, 130, and the scalar K edge:
  // K = 20, 37, 72) and the register-held rows of row_lse (nc a multiple of
  // the width up to four vectors) next to the general path.
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {5, 3}, {8, 8}, {16, 16}, {17, 16}, {33, 20}, {64, 64}, {70, 37}, {130, 72}}) {
      check_pack_b(K.f32, n, k);
      check_pack_b(K.f64, n, k);
    }
    for (int64_t nc = 1; nc <= 70; ++nc) {
      check_row_lse(K.f32, 3, nc, false, 2e-6);
      check_row_lse(K.f64, 3, nc, false, 1e-13);
      check_row_lse(K.f32, 2, nc, true, 2e-6);
    }
  }
}

// transpose: B = A^T exactly (a copy), B's lanes past `rows` zero, B's rows
// past `cols` and A's padding (NaN here) untouched and unused.
template <class T>
void check_transpose(const asap::fast::detail::KernelTable<T>& kt, int64_t rows, int64_t cols) {
  const int64_t W = kt.width, lda = (cols + W - 1) / W * W + W, ldb = (rows + W - 1) / W * W;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> A(static_cast<size_t>(rows * lda), nan), B(static_cast<size_t>((cols + 1) * ldb), T(-7));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      A[i * lda + j] = static_cast<T>(std::sin(0.37 * static_cast<double>(i * 101 + j)));
  kt.transpose(rows, cols, A.data(), lda, B.data(), ldb);
  int wrong = 0;
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < ldb; ++i) {
      const T want = i < rows ? A[i * lda + j] : T(0);
      wrong += !(B[j * ldb + i] == want);
    }
  for (int64_t i = 0; i < ldb; ++i) wrong += B[cols * ldb + i] != T(-7);  // the row past cols
  CHECK_MESSAGE(wrong == 0, "transpose rows=" << rows << " cols=" << cols << ": " << wrong << " entries wrong");
}

TEST_CASE("fast: transpose is A^T with zero padding lanes on every instruction set") {
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    for (int64_t rows : {1, 7, 8, 16, 17, 33, 50})
      for (int64_t cols : {1, 5, 16, 17, 40, 64}) {
        check_transpose(K.f32, rows, cols);
        check_transpose(K.f64, rows, cols);
      }
  }
}

// The column kernels' vector tails (col_lse_tail, col_max_tail, col_exp_tail)
// on the last rem < W columns, from kColVectorTailMin on: against float64
// definitions, with S's padding lanes NaN (loaded, never used), E's padding
// lanes and the state past rem left as they were, and a running state
// carried in (cmax, csum as a previous chunk of rows leaves them).
template <class T>
void check_col_tails(const asap::fast::detail::KernelTable<T>& kt, int64_t rows, int64_t rem, double tol) {
  const int64_t W = kt.width, lds = W + 3;  // rows read up to W lanes; a stride that is not a multiple of W
  const T nan = std::numeric_limits<T>::quiet_NaN(), sentinel = T(-7);
  std::vector<T> S(static_cast<size_t>(rows * lds), nan), radd(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    radd[r] = static_cast<T>(std::cos(0.9 * static_cast<double>(r)));
    for (int64_t j = 0; j < rem; ++j) S[r * lds + j] = static_cast<T>(4.0 * std::sin(1.3 * r + 0.71 * j));
  }
  // The state a previous chunk left (finite) and past rem a sentinel.
  std::vector<T> cmax(static_cast<size_t>(W + 1), sentinel), csum(cmax.size(), sentinel);
  for (int64_t j = 0; j < rem; ++j) cmax[j] = static_cast<T>(0.5 * j - 1.0), csum[j] = static_cast<T>(1.0 + 0.25 * j);
  auto lse_lse = cmax, lse_sum = csum, mx = cmax;
  kt.col_lse_tail(rows, rem, S.data(), lds, radd.data(), lse_lse.data(), lse_sum.data());
  kt.col_max_tail(rows, rem, S.data(), lds, radd.data(), mx.data());
  // col_exp_tail into E (padding lanes -7, must stay) and in place on a copy of S.
  std::vector<T> E(static_cast<size_t>(rows * lds), sentinel), Sin = S;
  auto esum = csum, esum_in = csum;
  kt.col_exp_tail(rows, rem, S.data(), lds, radd.data(), cmax.data(), esum.data(), E.data(), lds);
  kt.col_exp_tail(rows, rem, Sin.data(), lds, radd.data(), cmax.data(), esum_in.data(), Sin.data(), lds);
  int wrong = 0;
  for (int64_t j = 0; j < rem; ++j) {
    double m = cmax[j], e = 0;
    for (int64_t r = 0; r < rows; ++r) m = std::max(m, static_cast<double>(static_cast<T>(S[r * lds + j] + radd[r])));
    const double lse0 = static_cast<double>(cmax[j]) + std::log(static_cast<double>(csum[j]));
    double acc = std::exp(lse0 - m);
    for (int64_t r = 0; r < rows; ++r) {
      const double x = std::exp(static_cast<double>(S[r * lds + j]) + radd[r] - static_cast<double>(cmax[j]));
      e += x;
      acc += std::exp(static_cast<double>(S[r * lds + j]) + radd[r] - m);
      wrong += !(std::abs(static_cast<double>(E[r * lds + j]) - x) <= tol * x);
      wrong += !(E[r * lds + j] == Sin[r * lds + j]);
    }
    const double lse = m + std::log(acc);
    const double got = static_cast<double>(lse_lse[j]) + std::log(static_cast<double>(lse_sum[j]));
    wrong += !(std::abs(got - lse) <= tol * std::max(1.0, std::abs(lse)));
    wrong += !(static_cast<double>(mx[j]) == m);
    const double want_sum = static_cast<double>(csum[j]) + e;
    wrong += !(std::abs(static_cast<double>(esum[j]) - want_sum) <= tol * want_sum);
    wrong += !(esum_in[j] == esum[j]);
  }
  for (int64_t j = rem; j <= W; ++j)  // the state past rem untouched
    wrong += !(lse_lse[j] == sentinel && lse_sum[j] == sentinel && mx[j] == sentinel && esum[j] == sentinel);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = rem; j < lds; ++j) {
      wrong += !(E[r * lds + j] == sentinel);
      wrong += !std::isnan(Sin[r * lds + j]);  // rewritten unchanged in place
    }
  CHECK_MESSAGE(wrong == 0, "column tails rows=" << rows << " rem=" << rem << ": " << wrong << " checks failed");
}

TEST_CASE("fast: the column kernels' vector tails against their definitions on every instruction set") {
  // The engine runs them on the last rem columns from kColVectorTailMin on
  // (short and padded sequences: n = 8, 12, 20, ... and most of the padded
  // text teacher's rows); the fused tests reach them through n = 9, 37 and
  // the key masks, this test on every rem one by one.
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    for (int64_t rows : {1, 5, 17})
      for (int64_t rem = asap::fast::detail::kColVectorTailMin; rem < K.f32.width; ++rem) {
        check_col_tails(K.f32, rows, rem, 2e-6);
        if (rem < K.f64.width) check_col_tails(K.f64, rows, rem, 1e-13);
      }
  }
}

// gemm_nt with N = 1 mod W: the last column, alone in its vector, takes
// last_column_nt (rows in lanes); with one more column (N + 1) the same
// column comes from the micro tiles. Both must be the same bits, and both
// within float rounding of a float64 dot product.
template <class T>
void check_last_column(const asap::fast::detail::KernelTable<T>& kt, int64_t M, int64_t N, int64_t K) {
  const int64_t NR = kt.nt_nr, lda = K + 1, ldc = (N + 1 + NR - 1) / NR * NR;
  std::vector<T> A(static_cast<size_t>(M * lda)), B(static_cast<size_t>((N + 1) * K));
  for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<T>(std::sin(0.61 * static_cast<double>(i)) * 2.0);
  for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<T>(std::cos(0.29 * static_cast<double>(i)));
  const int64_t panels = (N + 1 + NR - 1) / NR;
  std::vector<T> Bp(static_cast<size_t>(panels * K * NR)), C1(static_cast<size_t>(M * ldc)), C2(C1.size());
  kt.pack_b(N + 1, K, B.data(), K, T(1), Bp.data());
  kt.gemm_nt(M, N, K, A.data(), lda, Bp.data(), C1.data(), ldc);
  kt.gemm_nt(M, N + 1, K, A.data(), lda, Bp.data(), C2.data(), ldc);
  int differ = 0;
  double worst = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) differ += C1[i * ldc + j] != C2[i * ldc + j];
    double ref = 0, mag = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double t = static_cast<double>(A[i * lda + k]) * static_cast<double>(B[(N - 1) * K + k]);
      ref += t;
      mag += std::abs(t);
    }
    worst = std::max(worst, std::abs(static_cast<double>(C1[i * ldc + N - 1]) - ref) / mag);
  }
  CHECK_MESSAGE(differ == 0, "gemm_nt M=" << M << " N=" << N << " K=" << K << ": " << differ << " entries differ");
  CHECK_MESSAGE(worst < 1e-5, "gemm_nt M=" << M << " N=" << N << " K=" << K << ": last column off by " << worst);
}

TEST_CASE("fast: gemm_nt's lone last column (n = 17, 33, ...) is the micro tiles' bits on every instruction set") {
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    const int64_t W = K.f32.width;
    for (int64_t M : {1, 5, 17, 40})
      for (int64_t N : {int64_t{1}, W + 1, 2 * W + 1, 4 * W + 1})
        for (int64_t k : {W, 4 * W, 8 * W, 9 * W, W + 3}) {
          check_last_column(K.f32, M, N, k);
          check_last_column(K.f64, M, N, k);
        }
  }
}

// gemm_tn on A^T against gemm_nn on A: the same sums in the same order, so
// the same bits, with and without row scales and B's row scales; gemm_nn with
// B's row scales (bscale) against gemm_nn on B's rows scaled first, bit for
// bit (the final column pass relies on it); and gemm_nn with and without
// bscale against float64 sums computed here.
template <class T>
void check_gemm_tn(const asap::fast::detail::KernelTable<T>& kt, int64_t M, int64_t N, int64_t Nv) {
  const int64_t lda = N + 3, ldat = M + 5, ldc = Nv + kt.width;
  std::vector<T> A(static_cast<size_t>(M * lda)), AT(static_cast<size_t>(N * ldat)), B(static_cast<size_t>(N * Nv));
  std::vector<T> rs(static_cast<size_t>(M)), bs(static_cast<size_t>(N)), Bs(B.size());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      A[i * lda + j] = AT[j * ldat + i] = static_cast<T>(std::sin(0.37 * static_cast<double>(i * N + j)) + 1.5);
  for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<T>(std::cos(0.23 * static_cast<double>(i)));
  for (int64_t i = 0; i < M; ++i) rs[i] = static_cast<T>(0.5 + 0.01 * static_cast<double>(i));
  for (int64_t j = 0; j < N; ++j) {
    bs[j] = static_cast<T>(0.3 + 0.07 * static_cast<double>(j));
    for (int64_t c = 0; c < Nv; ++c) Bs[j * Nv + c] = B[j * Nv + c] * bs[j];
  }
  for (const T* scale : {static_cast<const T*>(nullptr), static_cast<const T*>(rs.data())}) {
    std::vector<T> C1(static_cast<size_t>(M * ldc), T(7)), C2(C1), C3(C1), C4(C1);
    kt.gemm_nn(M, N, Nv, A.data(), lda, B.data(), Nv, C1.data(), ldc, scale, nullptr);
    kt.gemm_tn(M, N, Nv, AT.data(), ldat, B.data(), Nv, C2.data(), ldc, scale, nullptr);
    kt.gemm_nn(M, N, Nv, A.data(), lda, B.data(), Nv, C3.data(), ldc, scale, bs.data());
    kt.gemm_nn(M, N, Nv, A.data(), lda, Bs.data(), Nv, C4.data(), ldc, scale, nullptr);
    CHECK_MESSAGE(C3 == C4, "gemm_nn with B's row scales M=" << M << " N=" << N << " Nv=" << Nv
                                                             << ": not the product with B's rows scaled first");
    CHECK_MESSAGE(C3 != C1, "gemm_nn M=" << M << " N=" << N << " Nv=" << Nv << ": B's row scales had no effect");
    // gemm_tn takes B's row scales the same way.
    std::vector<T> C5(C1);
    kt.gemm_tn(M, N, Nv, AT.data(), ldat, B.data(), Nv, C5.data(), ldc, scale, bs.data());
    CHECK_MESSAGE(C5 == C3,
                  "gemm_tn with B's row scales M=" << M << " N=" << N << " Nv=" << Nv << ": not gemm_nn with them");
    int differ = 0;
    double worst = 0, worst_bs = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t c = 0; c < Nv; ++c) {
        differ += C1[i * ldc + c] != C2[i * ldc + c];
        double ref = 0, mag = 0, ref_bs = 0, mag_bs = 0;
        for (int64_t j = 0; j < N; ++j) {
          const double t = static_cast<double>(A[i * lda + j]) * static_cast<double>(B[j * Nv + c]);
          ref += t;
          mag += std::abs(t);
          ref_bs += t * static_cast<double>(bs[j]);
          mag_bs += std::abs(t) * static_cast<double>(bs[j]);
        }
        if (scale) {
          const double r = static_cast<double>(rs[i]);
          ref *= r, mag *= r, ref_bs *= r, mag_bs *= r;
        }
        worst = std::max(worst, std::abs(static_cast<double>(C1[i * ldc + c]) - ref) / mag);
        worst_bs = std::max(worst_bs, std::abs(static_cast<double>(C3[i * ldc + c]) - ref_bs) / mag_bs);
      }
    CHECK_MESSAGE(differ == 0, "gemm_tn M=" << M << " N=" << N << " Nv=" << Nv << ": " << differ << " entries differ");
    CHECK_MESSAGE(worst < 1e-5, "gemm_nn M=" << M << " N=" << N << " Nv=" << Nv << ": off by " << worst);
    CHECK_MESSAGE(worst_bs < 1e-5,
                  "gemm_nn with B's row scales M=" << M << " N=" << N << " Nv=" << Nv << ": off by " << worst_bs);
  }
}

TEST_CASE(
    "fast: gemm_tn is gemm_nn of the transposed operand, and B's row scales in gemm_nn are B scaled first, bit for "
    "bit, on every instruction set") {
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    for (int64_t M : {1, 5, 17, 40})
      for (int64_t N : {1, 17, 33})
        for (int64_t nv : {1, 2, 5}) {
          check_gemm_tn(K.f32, M, N, nv * K.f32.width);
          check_gemm_tn(K.f64, M, N, nv * K.f64.width);
        }
  }
}

TEST_CASE("fast: the vectorised log of row and column sums is accurate on every instruction set") {
  // Sums lie in [1, n]; zero, subnormal, inf and NaN lanes take libm's log.
  auto z = at::exp(at::linspace(0.0, 20.0, 20001, at::kDouble)).to(at::kFloat).contiguous();
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    auto out = at::full_like(z, 0.5f);  // the kernel adds to what is there
    K.f32.add_log(z.data_ptr<float>(), out.data_ptr<float>(), z.numel());
    auto ref = at::log(z.to(at::kDouble)) + 0.5;
    CHECK((out.to(at::kDouble) - ref).abs().max().item<double>() < 4e-6);  // a few ulp of values up to 20
    std::vector<float> odd(37, 2.0f), o(37, 0.0f);
    odd[3] = 0.0f;
    odd[20] = std::numeric_limits<float>::infinity();
    odd[33] = 1e-40f;
    K.f32.add_log(odd.data(), o.data(), 37);
    CHECK(o[3] == -std::numeric_limits<float>::infinity());
    CHECK(o[20] == std::numeric_limits<float>::infinity());
    CHECK(o[33] == doctest::Approx(std::log(1e-40)).epsilon(1e-3));
    CHECK(o[0] == doctest::Approx(std::log(2.0)).epsilon(1e-6));
    // Every count up to two vectors and one (full vectors, then the values
    // past them one by one), and nothing past count written.
    for (int64_t count = 1; count <= 2 * K.f32.width + 1; ++count) {
      CAPTURE(count);
      auto zc = at::linspace(1.0, 40.0, count, at::kFloat).contiguous();
      std::vector<float> oc(static_cast<size_t>(count) + 1, 0.25f);
      oc[count] = -0.0f;  // sentinel: adding even log(1) = +0 to it would clear its sign bit
      K.f32.add_log(zc.data_ptr<float>(), oc.data(), count);
      for (int64_t j = 0; j < count; ++j)
        CHECK(std::abs(oc[j] - (std::log(static_cast<double>(zc[j].item<float>())) + 0.25)) < 2e-6);
      CHECK((oc[count] == 0.0f && std::signbit(oc[count])));
    }
    std::vector<double> zd{1.0, 3.0, 1e5}, od(3, 0.0);
    K.f64.add_log(zd.data(), od.data(), 3);
    for (int i = 0; i < 3; ++i) CHECK(od[i] == doctest::Approx(std::log(zd[i])).epsilon(1e-15));
  }
}

TEST_CASE("fast: a log-sum-exp pass starts and ends in whole vectors on every instruction set") {
  // lse_start: -inf and 0 over the count rounded up to whole vectors, nothing
  // past; lse_finish: log_m - mx - log(sm), special sums through libm.
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    const auto& K = kernels_of(isa);
    const int64_t W = K.f32.width;
    for (int64_t count = 1; count <= 2 * W + 1; ++count) {
      CAPTURE(count);
      const int64_t whole = (count + W - 1) / W * W;
      std::vector<float> mx(static_cast<size_t>(whole) + 1, 7.0f), sm(static_cast<size_t>(whole) + 1, 7.0f);
      K.f32.lse_start(mx.data(), sm.data(), count);
      for (int64_t j = 0; j < whole; ++j) CHECK((mx[j] == -std::numeric_limits<float>::infinity() && sm[j] == 0.0f));
      CHECK((mx[whole] == 7.0f && sm[whole] == 7.0f));
      auto m = at::linspace(-30.0, 30.0, count, at::kFloat).contiguous();
      auto z = at::linspace(1.0, 40.0, count, at::kFloat).flip(0).contiguous();
      std::vector<float> out(static_cast<size_t>(count) + 1, 0.25f);
      out[count] = -0.0f;  // sentinel
      K.f32.lse_finish(m.data_ptr<float>(), z.data_ptr<float>(), 1.5f, out.data(), count);
      for (int64_t j = 0; j < count; ++j) {
        const double ref = 1.5 - m[j].item<float>() - std::log(static_cast<double>(z[j].item<float>()));
        CHECK(std::abs(out[j] - ref) < 4e-6 * std::max(1.0, std::abs(ref)));
      }
      CHECK((out[count] == 0.0f && std::signbit(out[count])));
    }
    // Zero, infinite, subnormal and NaN sums, in a full vector and past it.
    const int64_t n = 2 * W + 3;
    std::vector<float> z(static_cast<size_t>(n), 2.0f), m(static_cast<size_t>(n), 1.0f), out(static_cast<size_t>(n));
    const float inf = std::numeric_limits<float>::infinity();
    z[W - 1] = 0.0f;  // the last lane of the first vector
    z[W + 2] = inf;
    z[W + 5] = 1e-40f;
    z[n - 1] = std::numeric_limits<float>::quiet_NaN();
    K.f32.lse_finish(m.data(), z.data(), 0.0f, out.data(), n);
    CHECK(out[W - 1] == inf);
    CHECK(out[W + 2] == -inf);
    CHECK(out[W + 5] == doctest::Approx(-1.0 - std::log(1e-40)).epsilon(1e-3));
    CHECK(std::isnan(out[n - 1]));
    CHECK(out[0] == doctest::Approx(-1.0 - std::log(2.0)).epsilon(1e-6));
    CHECK(out[W + 3] == doctest::Approx(-1.0 - std::log(2.0)).epsilon(1e-6));
    std::vector<double> md{0.5, -2.0, 3.0}, zd{1.0, 3.0, 1e5}, od(3);
    K.f64.lse_finish(md.data(), zd.data(), 2.0, od.data(), 3);
    for (int i = 0; i < 3; ++i) CHECK(od[i] == doctest::Approx(2.0 - md[i] - std::log(zd[i])).epsilon(1e-15));
    std::vector<double> a(static_cast<size_t>(K.f64.width) + 1, 7.0), b(static_cast<size_t>(K.f64.width) + 1, 7.0);
    K.f64.lse_start(a.data(), b.data(), 1);
    for (int64_t j = 0; j < K.f64.width; ++j) CHECK((std::isinf(a[j]) && a[j] < 0 && b[j] == 0.0));
    CHECK((a[K.f64.width] == 7.0 && b[K.f64.width] == 7.0));
  }
}

TEST_CASE("fast: radix sort is a stable sort with ties by index") {
  at::manual_seed(3);
  asap::fast::detail::SortScratch<float> s32;
  asap::fast::detail::SortScratch<double> s64;
  std::vector<int32_t> order;
  for (int64_t m : {1, 2, 5, 47, 48, 49, 300, 2000}) {
    CAPTURE(m);
    // Few distinct values (many ties), signed zeros and negatives.
    auto v = (at::randint(-4, 5, {m}, at::kDouble) * 0.5).contiguous();
    if (m > 3) v[1] = -0.0, v[2] = 0.0;
    std::vector<int32_t> expect(m);
    std::iota(expect.begin(), expect.end(), 0);
    const double* p = v.data_ptr<double>();
    std::stable_sort(expect.begin(), expect.end(), [p](int32_t a, int32_t b) { return p[a] < p[b]; });
    asap::fast::detail::sort_order<double>(
        m, [p](int64_t r) { return p[r]; }, s64, order);
    CHECK(order == expect);
    auto vf = v.to(at::kFloat).contiguous();
    const float* pf = vf.data_ptr<float>();
    asap::fast::detail::sort_order<float>(
        m, [pf](int64_t r) { return pf[r]; }, s32, order);
    CHECK(order == expect);
    // The packed (key, position) sort and the values-only sort.
    std::vector<double> sorted(m), values(m);
    asap::fast::detail::sorted_with_order(m, pf, s32, order, sorted.data());
    CHECK(order == expect);
    asap::fast::detail::sorted_values<float>(m, pf, s32, values.data());
    for (int64_t r = 0; r < m; ++r) {
      CHECK(sorted[r] == static_cast<double>(pf[expect[r]]));
      CHECK(values[r] == sorted[r]);
    }
    asap::fast::detail::sorted_with_order(m, p, s64, order, sorted.data());
    CHECK(order == expect);
    asap::fast::detail::sorted_values<double>(m, p, s64, values.data());
    for (int64_t r = 0; r < m; ++r) CHECK(values[r] == p[expect[r]]);
    auto r = at::randn({m}, at::kFloat).contiguous();
    const float* pr = r.data_ptr<float>();
    std::iota(expect.begin(), expect.end(), 0);
    std::stable_sort(expect.begin(), expect.end(), [pr](int32_t a, int32_t b) { return pr[a] < pr[b]; });
    asap::fast::detail::sort_order<float>(
        m, [pr](int64_t i) { return pr[i]; }, s32, order);
    CHECK(order == expect);
    asap::fast::detail::sorted_with_order(m, pr, s32, order, sorted.data());
    CHECK(order == expect);
  }
}

TEST_CASE("fast: the library is built so that at::parallel_for runs in parallel") {
  CHECK_MESSAGE(asap::fast::parallel_build(),
                "at::parallel_for is serial in this build: link the asap target with OpenMP::OpenMP_CXX");
}

TEST_CASE("fast: teacher matches the reference (dtypes, masks, conventions, budgets, strategies)") {
  at::manual_seed(17);
  int seed = 0;
  for (auto dtype : {at::kDouble, at::kFloat}) {
    for (int64_t n : {1, 2, 9, 37, 130}) {
      for (bool masked : {false, true}) {
        for (bool drop : {false, true}) {
          if (drop && !masked) continue;
          // dv = 40 at n = 9 and 64 at n = 130: a final column pass then
          // scales E's columns, where that costs less than scaling V's rows
          // in every micro tile of the GEMM (at n = 130 in two column blocks
          // on the within-head configurations); dv = 5 scales V.
          const int64_t B = 2, H = 3, d = 8, dv = n == 9 ? 40 : n == 130 ? 64 : 5;
          auto q = at::randn({B, H, n, d}, dtype), k = at::randn({B, H, n, d}, dtype);
          auto v = at::randn({B, H, n, dv}, dtype);
          auto mask = masked ? make_mask(B, n, seed++) : at::Tensor();
          asap::Convention c;
          c.drop_padded_queries = drop;
          c.eps = (n % 2 == 0) ? 0.7 : 1.0;
          c.multiply_by_n = n != 37;
          const double scale = 1.0 / std::sqrt(static_cast<double>(d)) * (n == 130 ? 2.0 : 1.0);
          for (int T = 1; T <= 9; ++T) {
            auto ref = asap::run_teacher_reference(q, k, v, mask, scale, T, c, true);
            for (const auto& cfg : configs()) {
              CAPTURE(dtype);
              CAPTURE(n);
              CAPTURE(masked);
              CAPTURE(drop);
              CAPTURE(T);
              CAPTURE(cfg.name);
              Threads th(cfg.threads);
              auto r = asap::fast::teacher(q, k, v, mask, scale, T, c, true, cfg.tuning);
              const double tol = tol_of(dtype);
              CHECK_REL(r.A, ref.A, tol);
              CHECK_REL(r.O, ref.O, tol);
              CHECK_REL(r.f, ref.f, tol);
              CHECK_REL(r.g, ref.g, tol);
              CHECK(r.f_star.defined() == ref.f_star.defined());
              if (ref.f_star.defined()) {
                CHECK_REL(r.f_star, ref.f_star, tol);
                CHECK_REL(r.phi_bar_star, ref.phi_bar_star, tol);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("fast: the automatic rule takes the transposed row passes from kTransposedMinRows rows to 100 keys") {
  // Which path ran shows in the bits: the transposed pass sums in another
  // order. The automatic choice must equal the forced one bit for bit, and
  // differ from the other path (else the comparison would prove nothing).
  const int64_t W = asap::fast::kTransposedMinRows;
  asap::Convention c;
  for (int64_t n : {W - 1, W, W + 1, int64_t(16), int64_t(100), int64_t(101)}) {
    CAPTURE(n);
    at::manual_seed(11);
    auto q = at::randn({2, 2, n, 16}), k = at::randn({2, 2, n, 16}), v = at::randn({2, 2, n, 16});
    auto run = [&](int rule) {
      asap::fast::Tuning t;
      t.transposed_rows = rule;
      return asap::fast::teacher(q, k, v, at::Tensor(), 0.5, 6, c, false, t).O;
    };
    const bool expect = n >= W && n <= 100;
    const auto automatic = run(-1), on = run(1), off = run(0);
    CHECK_FALSE(at::equal(on, off));
    CHECK(at::equal(automatic, expect ? on : off));
  }
}

TEST_CASE("fast: teacher without attention, without values, and the Sinkhorn normalizer") {
  at::manual_seed(5);
  auto q = at::randn({1, 4, 300, 16}), k = at::randn({1, 4, 300, 16}), v = at::randn({1, 4, 300, 16});
  asap::Convention c;
  const double s = 0.25;
  auto ref = asap::run_teacher_reference(q, k, v, at::Tensor(), s, 6, c, false);
  auto r = asap::fast::teacher(q, k, v, at::Tensor(), s, 6, c, false);
  CHECK_FALSE(r.A.defined());
  CHECK_REL(r.O, ref.O, 1e-5);
  auto r2 = asap::fast::teacher(q, k, at::Tensor(), at::Tensor(), s, 5, c, true);
  auto ref2 = asap::run_teacher_reference(q, k, at::Tensor(), at::Tensor(), s, 5, c, true);
  CHECK_FALSE(r2.O.defined());
  CHECK_REL(r2.A, ref2.A, 1e-5);
  CHECK_REL(r2.phi_bar_star, ref2.phi_bar_star, 1e-5);
  auto r3 = asap::fast::sinkhorn_normalizer(q, k, v, at::Tensor(), s, 3, c);
  auto ref3 = asap::run_teacher_reference(q, k, v, at::Tensor(), s, 3, c, false);
  CHECK_REL(r3.O, ref3.O, 1e-5);
  // The deployed form (want_duals = false) returns the same O and A, and no duals.
  CHECK_FALSE(r3.f.defined());
  CHECK_FALSE(r3.f_star.defined());
  auto full3 = asap::fast::teacher(q, k, v, at::Tensor(), s, 3, c, true);
  auto lean3 = asap::run_teacher(q, k, v, at::Tensor(), s, 3, c, true, /*want_duals=*/false);
  CHECK(at::equal(lean3.O, full3.O));
  CHECK(at::equal(lean3.A, full3.A));
  CHECK(full3.f_star.defined());
  CHECK_FALSE(lean3.g.defined());
  CHECK_FALSE(lean3.phi_bar_star.defined());
  // Errors keep the reference's messages.
  CHECK_THROWS_AS(asap::fast::teacher(q, k, v, at::Tensor(), s, 0, c), asap::Error);
  CHECK_THROWS_AS(asap::fast::teacher(q, k, v, at::zeros({1, 300}, at::kBool), s, 2, c), asap::Error);
  CHECK_THROWS_AS(asap::fast::teacher(q, k.slice(2, 0, 10), v, at::Tensor(), s, 2, c), asap::Error);
}

#if defined(__x86_64__) || defined(__i386__)
TEST_CASE("fast: heads run with subnormals flushed to zero, and the caller's floating-point mode is kept") {
  // Values of 1e-39 (a float subnormal) are read as zero on every thread that
  // runs heads (denormals-are-zero), so the output of the teacher and of ESP
  // is exactly zero; without the
  // mode some rows would be about 1e-39. After the call the calling thread's
  // MXCSR is what it was, whether the bits were off or on.
  at::manual_seed(31);
  const unsigned bits = 0x8040, before = _mm_getcsr();
  const auto theta = asap::make_slice_bank(16, 4, 3);
  for (const auto& cfg : configs()) {
    for (bool caller_on : {false, true}) {
      CAPTURE(cfg.name);
      CAPTURE(caller_on);
      Threads th(cfg.threads);
      for (int64_t n : {17, 300}) {
        CAPTURE(n);
        auto q = at::randn({1, 2, n, 16}), k = at::randn({1, 2, n, 16});
        auto v = at::full({1, 2, n, 16}, 1e-39f);
        REQUIRE(v[0][0][0][0].item<float>() > 0.0f);  // stored as a subnormal, not flushed on the way in
        const unsigned mode = caller_on ? (before | bits) : (before & ~bits);
        _mm_setcsr(mode);
        auto r = asap::fast::teacher(q, k, v, at::Tensor(), 0.25, 3, asap::Convention{}, false, cfg.tuning);
        const unsigned after = _mm_getcsr();
        _mm_setcsr(before);
        CHECK(after == mode);
        CHECK(r.O.abs().max().item<float>() == 0.0f);
        // ESP's heads too (O_i = sum_l w_l v_sigma_l(i)).
        _mm_setcsr(mode);
        auto o = asap::fast::esp_attention(q, k, v, theta, 0.25, 2.0, cfg.tuning);
        const unsigned after_esp = _mm_getcsr();
        _mm_setcsr(before);
        CHECK(after_esp == mode);
        CHECK(o.abs().max().item<float>() == 0.0f);
      }
    }
  }
}
#endif

TEST_CASE("fast: features match the reference (families, masks, ties)") {
  at::manual_seed(23);
  std::vector<asap::FeatureFamily> fams(10);
  fams[0].slices = 16;
  fams[1].slices = 16, fams[1].alpha = true;
  fams[2].slices = 16, fams[2].alpha = true, fams[2].softmax_dual = true;
  fams[3].alpha = true, fams[3].softmax_dual = true;
  fams[4].slices = 16, fams[4].alpha = true, fams[4].softmax_dual = true, fams[4].sinkhorn_dual3 = true;
  fams[5].sinkhorn_dual3 = true;
  fams[6].score_stats = true;  // the row score statistics alone, and with everything else
  fams[7].slices = 16, fams[7].alpha = true, fams[7].softmax_dual = true, fams[7].sinkhorn_dual3 = true;
  fams[7].score_stats = true;
  fams[8].score_stats = fams[8].centered_stats = true;  // the centered statistics alone, and with everything else
  fams[9] = fams[7];
  fams[9].centered_stats = true;
  const int64_t d = 6;
  auto bank = asap::make_slice_bank(d, 16, 99);
  // Axis-aligned slices on integer data: exact ties in every projection.
  auto axes = at::zeros({d, 16}, at::kDouble);
  for (int64_t l = 0; l < 16; ++l) axes[l % d][l] = 1.0;
  int seed = 0;
  for (auto dtype : {at::kDouble, at::kFloat}) {
    for (int64_t n : {1, 3, 40, 97}) {
      for (int tie : {0, 1}) {
        for (bool masked : {false, true}) {
          for (bool drop : {false, true}) {
            if (drop && !masked) continue;
            const int64_t B = 2, H = 2;
            auto q = at::randn({B, H, n, d}, dtype), k = at::randn({B, H, n, d}, dtype);
            if (tie) {
              q = at::round(q * 2), k = at::round(k * 2);
              if (n > 4) q.select(2, 1).copy_(q.select(2, 3)), k.select(2, 0).copy_(k.select(2, 2));
            }
            auto theta = tie ? axes : bank;
            auto mask = masked ? make_mask(B, n, seed++) : at::Tensor();
            const double scale = 1.0 / std::sqrt(static_cast<double>(d)), eps = 0.8;
            auto m = asap::log_marginals(mask, B, n, drop, dtype, at::kCPU);
            for (const auto& fam : fams) {
              auto ref = asap::build_features(q, k, m, theta, fam, scale, eps);
              for (const auto& cfg : configs()) {
                CAPTURE(dtype);
                CAPTURE(n);
                CAPTURE(tie);
                CAPTURE(masked);
                CAPTURE(drop);
                CAPTURE(fam.name());
                CAPTURE(cfg.name);
                Threads th(cfg.threads);
                auto r = asap::fast::build_features(q, k, mask, drop, theta, fam, scale, eps, cfg.tuning);
                CHECK_REL(r, ref, tol_of(dtype));
              }
            }
          }
        }
      }
    }
  }
}

namespace {
asap::CompiledLayer make_layer(int64_t H, int64_t d, const asap::FeatureFamily& fam, bool per_head, bool drop, int T,
                               double eps, bool mult) {
  asap::CompiledLayer L;
  L.spec.name = "fast.layer";
  L.spec.layout = asap::ProjLayout::kNone;
  L.spec.heads = H;
  L.spec.head_dim = d;
  L.spec.value_dim = d;
  L.spec.score_scale = 1.0 / std::sqrt(static_cast<double>(d));
  L.spec.eps = eps;
  L.spec.T = T;
  L.spec.mask = drop ? asap::MaskConvention::kDropQueries : asap::MaskConvention::kKeepQueries;
  L.spec.multiply_by_n = mult;
  L.theta = asap::make_slice_bank(d, 24, 7);
  L.family = fam;
  L.per_head = per_head;
  L.coef = at::randn({per_head ? H : 1, fam.num_columns()}, at::kDouble) * 0.3;
  L.default_closures = T % 2 == 0 ? 3 : 2;
  return L;
}
}  // namespace

namespace {
// The fused ASAP call against run_layer_reference for one dtype: every
// family below, n in {1, 2, 16, 17, 33, 64, 130}, with and without key
// masks under both conventions, pooled or per head (alternating), k = 0 (the layer's
// default) to 5 (both endings), every instruction set at every k and the
// threading and tile strategies at k = 0, 1 and 5.
void check_fused_against_reference(at::ScalarType dtype, int seed_base) {
  at::manual_seed(41 + seed_base);
  // With slices, and slice-free (alpha, the softmax dual and the teacher's
  // dual after three steps taken from the passes the call runs anyway).
  std::vector<asap::FeatureFamily> fams(14);
  fams[0].slices = 12;
  fams[1].slices = 24, fams[1].alpha = true;
  fams[2].slices = 8, fams[2].alpha = true, fams[2].softmax_dual = true;
  fams[3].slices = 8, fams[3].alpha = true, fams[3].softmax_dual = true, fams[3].sinkhorn_dual3 = true;
  fams[4].alpha = true;
  fams[5].alpha = true, fams[5].softmax_dual = true;
  fams[6].alpha = true, fams[6].softmax_dual = true, fams[6].sinkhorn_dual3 = true;
  // The row score statistics (score_stats): slice-free and with slices.
  fams[7].alpha = true, fams[7].score_stats = true;
  fams[8].alpha = true, fams[8].softmax_dual = true, fams[8].sinkhorn_dual3 = true, fams[8].score_stats = true;
  fams[9].slices = 8, fams[9].alpha = true, fams[9].score_stats = true;
  // The centered statistics (centered_stats): slice-free and with slices.
  fams[10] = fams[7], fams[10].centered_stats = true;
  fams[11] = fams[9], fams[11].centered_stats = true;
  // The statistics without alpha (the one-kernel path's coefficients start at
  // beta[0], and alpha's weight is zero).
  fams[12].score_stats = true;
  fams[13] = fams[12], fams[13].centered_stats = true;
  int seed = seed_base;
  {
    for (int64_t n : {1, 2, 16, 17, 33, 64, 130}) {
      for (bool masked : {false, true}) {
        for (bool drop : {false, true}) {
          if (drop && !masked) continue;
          for (size_t fi = 0; fi < fams.size(); ++fi) {
            for (bool per_head : {(fi + n + masked + drop) % 2 == 0}) {  // pooled and per head alternate over n
              const int64_t B = 2, H = 3, d = 8;
              const int T = (fi + per_head) % 2 == 0 ? 6 : 5;
              // eps != 1 for the statistics families: their centered variance enters
              // the dual with eps^2, the other statistics with eps.
              const double eps = fi == 1 ? 0.6 : fi >= 7 ? 0.7 : 1.0;
              auto L = make_layer(H, d, fams[fi], per_head, drop, T, eps, !(fi == 2 && per_head));
              auto q = at::randn({B, H, n, d}, dtype), k = at::randn({B, H, n, d}, dtype);
              // Wide values at n = 16 and 17: the final column pass scales
              // E's columns instead of V's rows there.
              auto v = at::randn({B, H, n, n == 16 || n == 17 ? 48 : d}, dtype);
              auto mask = masked ? make_mask(B, n, seed++) : at::Tensor();
              for (int kc = 0; kc <= 5; ++kc) {
                asap::RunOptions o;
                o.closures = kc;
                o.return_attention = true;
                o.return_phi = true;
                o.return_features = true;
                auto ref = asap::run_layer_reference(L, q, k, v, mask, o);
                for (const auto& cfg : configs()) {
                  const bool isa_only = cfg.name.find("/auto/1 thread") != std::string::npos;
                  if (!isa_only && kc >= 2 && kc <= 4) continue;
                  CAPTURE(dtype);
                  CAPTURE(n);
                  CAPTURE(masked);
                  CAPTURE(drop);
                  CAPTURE(fams[fi].name());
                  CAPTURE(per_head);
                  CAPTURE(kc);
                  CAPTURE(cfg.name);
                  Threads th(cfg.threads);
                  auto r = asap::fast::asap_layer(L, q, k, v, mask, o, cfg.tuning);
                  const double tol = tol_of(dtype);
                  // The fused call's own feature columns (its f1 and f3 come
                  // from the passes it runs) against the reference's.
                  CHECK_REL(r.features, ref.features, tol);
                  CHECK_REL(r.phi_hat, ref.phi_hat, tol);
                  CHECK_REL(r.out, ref.out, tol);
                  CHECK_REL(r.attention, ref.attention, tol);
                }
              }
              // Nothing but the output unless asked for, and the same
              // output (bit for bit; with the features asked for, the slice
              // columns are centered and rounded before the dot product).
              asap::RunOptions plain;
              auto bare = asap::fast::asap_layer(L, q, k, v, mask, plain);
              CHECK_FALSE(bare.attention.defined());
              CHECK_FALSE(bare.phi_hat.defined());
              CHECK_FALSE(bare.features.defined());
              asap::RunOptions some;
              some.return_attention = some.return_phi = true;
              CHECK(at::equal(bare.out, asap::fast::asap_layer(L, q, k, v, mask, some).out));
              some.return_features = true;
              CHECK_REL(bare.out, asap::fast::asap_layer(L, q, k, v, mask, some).out, tol_of(dtype));
            }
          }
        }
      }
    }
  }
}
}  // namespace

TEST_CASE("fast: the fused ASAP call matches run_layer in float64") { check_fused_against_reference(at::kDouble, 0); }
TEST_CASE("fast: the fused ASAP call matches run_layer in float32") { check_fused_against_reference(at::kFloat, 1000); }

TEST_CASE("fast: the fused call's f1 and f3 columns are the separately computed features") {
  // fast::build_features runs the softmax and sinkhorn3 columns through
  // features(); the fused call takes them from the passes of its own map.
  // Both must give the same columns (and so the same map) bit for bit in
  // float64 on one thread: any other dual than the first row pass from
  // g' = 0 (f1) or the row pass after one column pass (f3) shows here.
  at::manual_seed(43);
  asap::FeatureFamily fam;
  fam.alpha = true, fam.softmax_dual = true, fam.sinkhorn_dual3 = true;
  for (int64_t n : {2, 17, 50}) {
    for (bool masked : {false, true}) {
      CAPTURE(n);
      CAPTURE(masked);
      const int64_t B = 2, H = 2, d = 8;
      auto L = make_layer(H, d, fam, true, false, 6, 0.7, true);
      auto q = at::randn({B, H, n, d}, at::kDouble), k = at::randn({B, H, n, d}, at::kDouble);
      auto v = at::randn({B, H, n, d}, at::kDouble);
      auto mask = masked ? make_mask(B, n, 3) : at::Tensor();
      Threads th(1);
      asap::RunOptions o;
      o.return_features = true;
      auto r = asap::fast::asap_layer(L, q, k, v, mask, o);
      auto Psi = asap::fast::build_features(q, k, mask, false, L.theta, fam, L.spec.score_scale, L.spec.eps);
      CHECK(at::equal(r.features, Psi));
    }
  }
}

TEST_CASE("fast: larger heads, fewer heads than threads, recomputed tiles (float32)") {
  at::manual_seed(8);
  const int64_t n = 300, d = 32;
  auto q = at::randn({1, 1, n, d}), k = at::randn({1, 1, n, d}), v = at::randn({1, 1, n, d});
  asap::Convention c;
  const double s = 1.0 / std::sqrt(32.0);
  auto ref = asap::run_teacher_reference(q, k, v, at::Tensor(), s, 10, c, true);
  for (const auto& cfg : configs()) {
    CAPTURE(cfg.name);
    Threads th(cfg.threads);
    auto r = asap::fast::teacher(q, k, v, at::Tensor(), s, 10, c, true, cfg.tuning);
    CHECK_REL(r.A, ref.A, 1e-5);
    CHECK_REL(r.O, ref.O, 1e-5);
    CHECK_REL(r.phi_bar_star, ref.phi_bar_star, 1e-5);
  }
  asap::FeatureFamily fam;
  fam.slices = 24, fam.alpha = true, fam.softmax_dual = true;
  auto L = make_layer(1, d, fam, false, false, 6, 1.0, true);
  asap::RunOptions o;
  o.return_attention = true;
  auto lref = asap::run_layer_reference(L, q, k, v, at::Tensor(), o);
  auto lr = asap::fast::asap_layer(L, q, k, v, at::Tensor(), o);
  CHECK_REL(lr.out, lref.out, 1e-5);
  CHECK_REL(lr.attention, lref.attention, 1e-5);
}

TEST_CASE("fast: concurrent callers on the within-head path, and a team raised between calls") {
  at::manual_seed(12);
  // The callers below set LibTorch's count for threads started later (the
  // Threads helper sets only this thread's): put it back at the end.
  struct Restore {
    int n = at::get_num_threads();
    ~Restore() { at::set_num_threads(n); }
  } restore;
  const int64_t d = 16;
  asap::FeatureFamily fam;
  fam.slices = 8, fam.alpha = true, fam.softmax_dual = true;
  auto L = make_layer(1, d, fam, false, false, 6, 1.0, true);
  asap::fast::Tuning within;
  within.strategy = asap::fast::Strategy::kWithinHead;
  for (int64_t n : {200, 300}) {  // both lengths on the within-head path, as asked
    CAPTURE(n);
    auto q = at::randn({1, 1, n, d}), k = at::randn({1, 1, n, d}), v = at::randn({1, 1, n, d});
    auto ref = asap::run_layer_reference(L, q, k, v, at::Tensor(), {});
    asap::Convention c;
    auto tref = asap::run_teacher_reference(q, k, v, at::Tensor(), 0.25, 6, c, false);
    // Built for 2 threads, then called with 3: each thread keeps its own scratch.
    for (int threads : {2, 3, 1, 3}) {
      Threads th(threads);
      CHECK_REL(asap::fast::asap_layer(L, q, k, v, at::Tensor(), {}, within).out, ref.out, 1e-5);
      CHECK_REL(asap::fast::teacher(q, k, v, at::Tensor(), 0.25, 6, c, false, within).O, tref.O, 1e-5);
    }
    // Three callers at once, each with a 2-thread team on the within-head path.
    Threads th(2);
    std::vector<at::Tensor> outs(6), touts(6);
    std::vector<std::thread> callers;
    for (int t = 0; t < 3; ++t)
      callers.emplace_back([&, t] {
        at::set_num_threads(2);
        for (int r = 0; r < 2; ++r) {
          outs[2 * t + r] = asap::fast::asap_layer(L, q, k, v, at::Tensor(), {}, within).out;
          touts[2 * t + r] = asap::fast::teacher(q, k, v, at::Tensor(), 0.25, 6, c, false, within).O;
        }
      });
    for (auto& t : callers) t.join();
    for (int i = 0; i < 6; ++i) {
      CHECK_REL(outs[i], ref.out, 1e-5);
      CHECK_REL(touts[i], tref.O, 1e-5);
    }
  }
}

TEST_CASE("fast: fewer heads than threads run over heads below n = 256") {
  // One head's passes split over threads cost a fork/join per pass: 2-5x the
  // one-thread time at n = 17-128 (docs/performance.md, "Fewer heads than
  // threads"). So short heads stay whole whatever the head count.
  using asap::fast::detail::choose;
  const asap::fast::Tuning tuning;
  const int64_t panel = 32, bytes = 4;
  Threads th(2);
  for (int64_t n : {1, 17, 64, 255}) {
    CAPTURE(n);
    const auto c = choose(1, n, bytes, panel, tuning);
    CHECK(c.head_parallel);
    CHECK(c.threads == 1);
  }
  // From n = 256 a lone head, or a head count that does not divide among the
  // threads (and is under four per thread), splits its passes.
  for (int64_t heads : {1, 3}) {
    CAPTURE(heads);
    const auto c = choose(heads, 256, bytes, panel, tuning);
    CHECK_FALSE(c.head_parallel);
    CHECK(c.threads == 2);
  }
  CHECK(choose(4, 300, bytes, panel, tuning).head_parallel);
  CHECK(choose(9, 300, bytes, panel, tuning).head_parallel);
  // The strategy knob still overrides the rule.
  asap::fast::Tuning within;
  within.strategy = asap::fast::Strategy::kWithinHead;
  CHECK_FALSE(choose(1, 17, bytes, panel, within).head_parallel);
}

TEST_CASE("fast: inputs of another type than q are converted to q's") {
  // The fused path uses k, v and the mask as they are when their type is
  // right and converts them otherwise: float64 k and v and a 0/1 float mask
  // with float32 q give what all-float32 inputs give (converted here with
  // Tensor::to), for the teacher, the Sinkhorn layer through run_layer and
  // the compiled map.
  at::manual_seed(41);
  const int64_t B = 2, H = 2, n = 17, d = 16;
  auto q = at::randn({B, H, n, d}), k = at::randn({B, H, n, d}, at::kDouble), v = at::randn({B, H, n, d}, at::kDouble);
  auto mask = at::ones({B, n});
  mask[1].narrow(0, 9, 8).fill_(0.0);
  const auto k32 = k.to(at::kFloat), v32 = v.to(at::kFloat), m8 = mask.to(at::kBool);
  asap::Convention conv;
  CHECK(at::equal(asap::fast::teacher(q, k, v, mask, 0.25, 6, conv, false).O,
                  asap::fast::teacher(q, k32, v32, m8, 0.25, 6, conv, false).O));
  asap::FeatureFamily fam;
  fam.alpha = true, fam.softmax_dual = true;
  auto L = make_layer(H, d, fam, true, false, 6, 1.0, true);
  CHECK(at::equal(asap::fast::asap_layer(L, q, k, v, mask).out, asap::fast::asap_layer(L, q, k32, v32, m8).out));
  L.kind = asap::OperatorKind::kSinkhorn;
  L.sinkhorn_steps = 4;
  CHECK(at::equal(asap::run_layer(L, q, k, v, mask).out, asap::run_layer(L, q, k32, v32, m8).out));
}

TEST_CASE("fast: closure_errors equals the attention error of the reference closures") {
  // Compile's selection: ||A_k - A*||_F / ||A*||_F for k = 1..k_max closures
  // from each candidate's dual, against the ATen reference (teacher plan,
  // for_each_closure, plan_attention), with masks, both conventions and odd/even T.
  at::manual_seed(77);
  int seed = 0;
  for (auto dtype : {at::kDouble, at::kFloat}) {
    for (bool masked : {false, true}) {
      for (bool drop : {false, true}) {
        if (drop && !masked) continue;
        for (int T : {5, 6}) {
          const int64_t B = 2, H = 3, n = 37, d = 8, C = 2;
          const int kmax = 4;
          auto q = at::randn({B, H, n, d}, dtype), k = at::randn({B, H, n, d}, dtype);
          auto mask = masked ? make_mask(B, n, seed++) : at::Tensor();
          asap::Convention c;
          c.eps = 0.7;
          c.drop_padded_queries = drop;
          const double s = 0.4;
          auto m = asap::log_marginals(mask, B, n, drop, dtype, at::kCPU);
          auto teacher = asap::run_teacher_reference(q, k, at::Tensor(), mask, s, T, c, true);
          auto S = asap::scores(q, k, s);
          auto alpha = asap::cost_alpha(q, s);
          // Candidate duals: the teacher's own (centered) target plus noise of two sizes.
          std::vector<at::Tensor> phis;
          for (int64_t ci = 0; ci < C; ++ci) {
            auto target = at::where(m.row_active.expand({B, H, n}), teacher.phi_bar_star, at::zeros({}, dtype));
            phis.push_back(target + 0.3 * static_cast<double>(ci + 1) * at::randn({B, H, n}, dtype));
          }
          auto phi = at::stack(phis);
          Threads th(2);
          const std::vector<int> kc{kmax, kmax - 1};  // per candidate
          auto err = asap::fast::closure_errors(q, k, mask, s, T, c, phi, kc);
          REQUIRE(err.sizes() == at::IntArrayRef({C, kmax, B, H}));
          CHECK(err[1][kmax - 1].abs().max().item<double>() == 0.0);  // beyond candidate 1's count
          for (int64_t ci = 0; ci < C; ++ci) {
            auto f_hat = asap::dual_from_phi(phi[ci], alpha, m);
            asap::for_each_closure(S, f_hat, m, c.eps, kc[ci], [&](int kk, const at::Tensor& f, const at::Tensor& g) {
              auto A = asap::plan_attention(S, f, g, c).to(at::kDouble);
              auto As = teacher.A.to(at::kDouble);
              auto ref = (A - As).square().sum(at::IntArrayRef{-2, -1}).sqrt() /
                         As.square().sum(at::IntArrayRef{-2, -1}).sqrt();
              CAPTURE(dtype);
              CAPTURE(masked);
              CAPTURE(drop);
              CAPTURE(T);
              CAPTURE(ci);
              CAPTURE(kk);
              CHECK_REL(err[ci][kk - 1], ref, dtype == at::kFloat ? 1e-4 : 1e-9);
            });
          }
        }
      }
    }
  }
}

TEST_CASE("fast: the public entry points run the fast path on CPU and the reference elsewhere") {
  // run_teacher / run_layer are what the runtime, compile and verify call:
  // on CPU they return exactly the fast path's result, and the reference
  // agrees with them to the fast path's tolerance.
  at::manual_seed(5);
  const int64_t B = 2, H = 2, n = 33, d = 8;
  auto q = at::randn({B, H, n, d}), k = at::randn({B, H, n, d}), v = at::randn({B, H, n, d});
  auto mask = make_mask(B, n, 3);
  asap::Convention c;
  const double s = 0.35;
  auto pub = asap::run_teacher(q, k, v, mask, s, 6, c, true);
  auto fst = asap::fast::teacher(q, k, v, mask, s, 6, c, true);
  auto ref = asap::run_teacher_reference(q, k, v, mask, s, 6, c, true);
  CHECK(at::equal(pub.O, fst.O));
  CHECK(at::equal(pub.A, fst.A));
  CHECK_REL(pub.O, ref.O, 1e-5);
  CHECK_REL(pub.phi_bar_star, ref.phi_bar_star, 1e-5);
  asap::FeatureFamily fam;
  fam.slices = 8, fam.alpha = true, fam.softmax_dual = true, fam.sinkhorn_dual3 = true;
  auto L = make_layer(H, d, fam, true, false, 6, 1.0, true);
  asap::RunOptions o;
  o.return_attention = true;
  auto lpub = asap::run_layer(L, q, k, v, mask, o);
  auto lfst = asap::fast::asap_layer(L, q, k, v, mask, o);
  auto lref = asap::run_layer_reference(L, q, k, v, mask, o);
  CHECK(at::equal(lpub.out, lfst.out));
  CHECK_REL(lpub.out, lref.out, 1e-5);
  CHECK_REL(lpub.attention, lref.attention, 1e-5);
  // Dtypes the fast path does not handle go to the reference (and its
  // error); half precision is widened to float32 above both. The kernels
  // themselves refuse what they do not handle instead of calling the
  // reference (one direction: runtime -> fast, runtime -> reference).
  CHECK_FALSE(asap::fast::handles(q.to(at::kHalf)));
  CHECK_THROWS_AS(asap::fast::teacher(q.to(at::kHalf), k.to(at::kHalf), v.to(at::kHalf), mask, s, 6, c), asap::Error);
  auto meta = at::empty({B, H, n, d}, at::TensorOptions().device(at::kMeta));
  CHECK_FALSE(asap::fast::handles(q, meta));
  CHECK_THROWS_AS(asap::fast::teacher(q, meta, v, mask, s, 6, c), asap::Error);
  CHECK_THROWS_AS(asap::fast::build_features(meta, meta, at::Tensor(), false, L.theta, fam, s, 1.0), asap::Error);
  auto q0 = q.slice(0, 0, 0), k0 = k.slice(0, 0, 0), v0 = v.slice(0, 0, 0);
  CHECK_FALSE(asap::fast::handles(q0, k0, v0));
  CHECK_THROWS_AS(asap::fast::asap_layer(L, q0, k0, v0, at::Tensor()), asap::Error);
  CHECK(asap::run_teacher(q0, k0, v0, at::Tensor(), s, 6, c, true).O.sizes() == v0.sizes());
  CHECK(asap::run_layer(L, q0, k0, v0, at::Tensor(), {}).out.sizes() == v0.sizes());
  auto Lsink = L;
  Lsink.kind = asap::OperatorKind::kSinkhorn;
  Lsink.sinkhorn_steps = 3;
  CHECK_THROWS_AS(asap::fast::asap_layer(Lsink, q, k, v, mask), asap::Error);
  CHECK(at::equal(
      asap::run_layer(Lsink, q, k, v, mask, {}).out,
      asap::fast::teacher(q, k, v, mask, L.spec.score_scale, 3, asap::convention_of(L.spec), false, {}, false).O));
  CHECK_THROWS_AS(asap::run_layer(L, q.to(at::kInt), k.to(at::kInt), v.to(at::kInt), mask, o), asap::Error);
  CHECK(at::equal(asap::run_layer(L, q.to(at::kHalf), k.to(at::kHalf), v.to(at::kHalf), mask, o).out,
                  asap::run_layer(L, q.to(at::kHalf).to(at::kFloat), k.to(at::kHalf).to(at::kFloat),
                                  v.to(at::kHalf).to(at::kFloat), mask, o)
                      .out.to(at::kHalf)));
}

TEST_CASE("fast: ESP hard-sort attention matches a direct implementation") {
  at::manual_seed(12);
  const int64_t B = 2, H = 2, n = 50, d = 4, dv = 3;
  for (auto dtype : {at::kDouble, at::kFloat}) {
    auto q = at::randn({B, H, n, d}, dtype), k = at::randn({B, H, n, d}, dtype), v = at::randn({B, H, n, dv}, dtype);
    auto theta = asap::make_slice_bank(d, 5, 3);
    const double s = 0.5, tau = 2.0;
    at::Tensor O;
    {
      Threads th(2);
      O = asap::fast::esp_attention(q, k, v, theta, s, tau);
    }
    // Direct: A = n sum_l w_l U_l with U_l the sorted matching of slice l.
    auto th = theta.to(dtype) * std::sqrt(s);
    auto X = at::matmul(q, th), Y = at::matmul(k, th);  // [B,H,n,L]
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        std::vector<at::Tensor> perms;
        std::vector<double> D;
        for (int64_t l = 0; l < theta.size(1); ++l) {
          auto ox = std::get<1>(X[b][h].select(1, l).sort(c10::optional<bool>(true), 0, false));
          auto oy = std::get<1>(Y[b][h].select(1, l).sort(c10::optional<bool>(true), 0, false));
          auto sigma = at::empty({n}, at::kLong);
          sigma.index_put_({ox}, oy);
          auto kq = k[b][h].index_select(0, sigma);
          D.push_back((0.5 * s * (q[b][h] - kq).pow(2).sum(-1)).mean().item<double>());
          perms.push_back(sigma);
        }
        const double dmin = *std::min_element(D.begin(), D.end());
        double wsum = 0;
        for (double x : D) wsum += std::exp(-tau * (x - dmin));
        auto expect = at::zeros({n, dv}, dtype);
        for (size_t l = 0; l < perms.size(); ++l)
          expect += std::exp(-tau * (D[l] - dmin)) / wsum * v[b][h].index_select(0, perms[l]);
        CHECK_REL(O[b][h], expect, dtype == at::kFloat ? 1e-5 : 1e-10);
      }
    }
  }
}

TEST_CASE("fast: a layer output is handed out again only when nothing else holds it") {
  // The fused calls keep the thread's last output O and return it again once
  // the caller has released it. A tensor the caller still holds, a view that
  // outlives it, a weak reference, or marks the caller put on it (autograd,
  // inference mode) keep it from being reused; rows a later call does not
  // write are zeros again.
  at::manual_seed(43);
  const int64_t B = 1, H = 2, n = 17, d = 16;
  auto q1 = at::randn({B, H, n, d}), k1 = at::randn({B, H, n, d}), v1 = at::randn({B, H, n, d});
  auto q2 = at::randn({B, H, n, d}), k2 = at::randn({B, H, n, d}), v2 = at::randn({B, H, n, d});
  asap::Convention conv;
  auto run = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return asap::fast::teacher(q, k, v, at::Tensor(), 0.25, 6, conv, false).O;
  };
  const auto want1 = run(q1, k1, v1).clone(), want2 = run(q2, k2, v2).clone();
  REQUIRE(!at::equal(want1, want2));
  SUBCASE("held: a new tensor, the held one unchanged") {
    auto a = run(q1, k1, v1);
    auto b = run(q2, k2, v2);
    CHECK(a.data_ptr() != b.data_ptr());
    CHECK(at::equal(a, want1));
    CHECK(at::equal(b, want2));
  }
  SUBCASE("released: the same storage, with the new call's values") {
    void* p = nullptr;
    {
      auto a = run(q1, k1, v1);
      p = a.data_ptr();
    }
    auto b = run(q2, k2, v2);
    CHECK(b.data_ptr() == p);
    CHECK(at::equal(b, want2));
  }
  SUBCASE("a view outlives its tensor") {
    // In inference mode a view holds the storage only, not its base tensor.
    c10::InferenceMode guard;
    at::Tensor view = run(q1, k1, v1).select(1, 0);
    auto b = run(q2, k2, v2);
    CHECK(at::equal(view, want1.select(1, 0)));
    CHECK(at::equal(b, want2));
  }
  SUBCASE("a weak reference") {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> weak(run(q1, k1, v1).getIntrusivePtr());
    auto b = run(q2, k2, v2);
    // The kept tensor is released when nothing but the weak reference holds
    // it; it must never show another call's values.
    auto strong = weak.lock();
    if (strong) CHECK(at::equal(at::Tensor(std::move(strong)), want1));
    CHECK(at::equal(b, want2));
  }
  SUBCASE("marks the caller put on it") {
    run(q1, k1, v1).requires_grad_(true);
    auto b = run(q2, k2, v2);
    CHECK(!b.requires_grad());
    {
      c10::InferenceMode guard;
      CHECK(run(q1, k1, v1).is_inference());
    }
    auto c = run(q2, k2, v2);
    CHECK(!c.is_inference());
    CHECK(at::equal(c, want2));
  }
  SUBCASE("rows a call does not write are zeros") {
    asap::Convention drop;
    drop.drop_padded_queries = true;
    auto mask = at::ones({B, n}, at::kBool);
    mask[0].narrow(0, 10, 7).fill_(false);
    const auto want = asap::fast::teacher(q2, k2, v2, mask, 0.25, 6, drop, false).O.clone();
    REQUIRE(want.narrow(2, 10, 7).abs().max().item<float>() == 0.0f);
    void* p = nullptr;
    {
      auto a = run(q1, k1, v1);  // every row written, then released
      p = a.data_ptr();
    }
    auto b = asap::fast::teacher(q2, k2, v2, mask, 0.25, 6, drop, false).O;
    CHECK(b.data_ptr() == p);
    CHECK(at::equal(b, want));
  }
  SUBCASE("the compiled map and run_layer") {
    asap::FeatureFamily fam;
    fam.alpha = true, fam.softmax_dual = true;
    auto L = make_layer(H, d, fam, true, false, 6, 1.0, false);
    const auto m1 = asap::fast::asap_layer(L, q1, k1, v1, at::Tensor()).out.clone();
    const auto m2 = asap::fast::asap_layer(L, q2, k2, v2, at::Tensor()).out.clone();
    auto a = asap::fast::asap_layer(L, q1, k1, v1, at::Tensor()).out;
    auto b = asap::run_layer(L, q2, k2, v2, at::Tensor()).out;
    CHECK(a.data_ptr() != b.data_ptr());
    CHECK(at::equal(a, m1));
    CHECK(at::equal(b, m2));
  }
}

TEST_CASE("fast: a thread's token sets follow each call's mask and length") {
  // The sets of active rows and keys are the calling thread's, rebuilt in
  // place per call (kept without a mask while n stays the same): calls that
  // alternate masks, batch sizes and lengths on one thread give what the
  // reference path gives.
  at::manual_seed(44);
  asap::Convention conv;
  conv.drop_padded_queries = true;
  int seed = 100;
  for (int64_t n : {17, 9, 17, 33}) {
    for (int64_t B : {3, 1}) {
      for (bool masked : {true, false, true}) {
        const int64_t H = 2, d = 8;
        auto q = at::randn({B, H, n, d}, at::kDouble), k = at::randn({B, H, n, d}, at::kDouble),
             v = at::randn({B, H, n, d}, at::kDouble);
        auto mask = masked ? make_mask(B, n, seed++) : at::Tensor();
        auto fast = asap::fast::teacher(q, k, v, mask, 0.3, 5, conv, false).O;
        auto ref = asap::run_teacher_reference(q, k, v, mask, 0.3, 5, conv, false).O;
        CHECK(at::allclose(fast, ref, 1e-9, 1e-10));
      }
    }
  }
}
