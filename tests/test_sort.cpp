// The lane-parallel sorting networks of the sliced features (issue 14,
// src/lib/fast/sort_network.h) against the scalar sorts and the ATen
// reference: the network itself (0-1 principle), per-lane order with ties,
// duplicates and signed zeros on every instruction set and both dtypes, and
// the features and the compiled operator with the network forced, the
// scalar sorts forced, and the reference, for n not a power of two, n = 1
// and 2, masks leaving a single active key, and both mask conventions.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "asap/features.h"
#include "asap/operator.h"
#include "asap/runtime.h"
#include "fast/common.h"
#include "fast/fast.h"
#include "fast/sort.h"
#include "fast/sort_network.h"
#include "test_util.h"

using asap_test::rel_err;
using asap_test::Threads;
using asap_test::tol_of;

namespace {

namespace fd = asap::fast::detail;

// Forces a sort path for a scope.
struct ForcePath {
  explicit ForcePath(fd::SortPath p) : old_(fd::sort_path()) { fd::set_sort_path(p); }
  ~ForcePath() { fd::set_sort_path(old_); }
  fd::SortPath old_;
};

struct Config {
  std::string name;
  asap::fast::Tuning tuning;
  int threads = 1;
};
std::vector<Config> configs() {
  std::vector<Config> out;
  for (const auto& isa : asap::fast::available_isas()) {
    asap::fast::Tuning t;
    t.isa = isa;
    out.push_back({isa + "/1 thread", t, 1});
  }
  asap::fast::Tuning t;
  t.strategy = asap::fast::Strategy::kWithinHead;  // lane blocks over threads
  out.push_back({"within-head/2 threads", t, 2});
  t.strategy = asap::fast::Strategy::kHeadParallel;
  t.isa = "generic";
  out.push_back({"generic/heads/2 threads", t, 2});
  return out;
}

// Masks: sequence 0 keeps a single key (at position n/2), sequence 1 keeps
// a prefix with an interior hole, the others everything.
at::Tensor sparse_mask(int64_t B, int64_t n) {
  auto m = at::ones({B, n}, at::kBool);
  m[0].fill_(false);
  m[0][n / 2] = true;
  if (B > 1 && n > 1) {
    m[1].slice(0, std::max<int64_t>(1, (2 * n) / 3)).fill_(false);
    if (n >= 6) m[1][n / 4] = false;
  }
  return m;
}

// The stable order of lane l of v [m][ld] (ties by position r).
template <class T>
std::vector<int32_t> stable_order(const std::vector<T>& v, int64_t m, int64_t ld, int l) {
  std::vector<int32_t> o(m);
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return v[a * ld + l] < v[b * ld + l]; });
  return o;
}

// Lane test data: lane kinds cycle through continuous values, few distinct
// values (heavy ties), signed zeros and infinities, all equal, and sorted /
// reverse-sorted runs with duplicates.
template <class T>
std::vector<T> lane_data(int64_t m, int64_t ld, uint64_t seed) {
  std::vector<T> v(m * ld);
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto rnd = [&]() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) / 9007199254740992.0;
  };
  const T inf = std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t l = 0; l < ld; ++l) {
      T x;
      switch (l % 6) {
        case 0:
          x = static_cast<T>(rnd() * 8 - 4);
          break;
        case 1:
          x = static_cast<T>(std::floor(rnd() * 4) - 2) * T(0.5);
          break;
        case 2: {
          const int k = static_cast<int>(rnd() * 5);
          x = k == 0 ? T(-0.0) : k == 1 ? T(0.0) : k == 2 ? inf : k == 3 ? -inf : static_cast<T>(rnd() - 0.5);
          break;
        }
        case 3:
          x = T(1.25);
          break;
        case 4:
          x = static_cast<T>((m - r) / 3);
          break;
        default:
          x = static_cast<T>(r / 2) * T(-1e-30) + static_cast<T>(1e-38);
          break;
      }
      v[r * ld + l] = x;
    }
  return v;
}

}  // namespace

TEST_CASE("sort network: the pruned odd-even merge network sorts every 0-1 input (m = 1..18)") {
  for (int64_t m = 1; m <= 18; ++m) {
    CAPTURE(m);
    int64_t nc = 0;
    const int32_t* c = fd::sort_network(m, &nc);
    for (int64_t t = 0; t < nc; ++t) {
      REQUIRE(c[2 * t] < c[2 * t + 1]);
      REQUIRE(c[2 * t + 1] < m);
    }
    bool all_sorted = true;
    for (uint32_t bits = 0; bits < (1u << m); ++bits) {
      std::vector<int> x(m);
      for (int64_t i = 0; i < m; ++i) x[i] = (bits >> i) & 1;
      for (int64_t t = 0; t < nc; ++t) {
        int& a = x[c[2 * t]];
        int& b = x[c[2 * t + 1]];
        if (a > b) std::swap(a, b);
      }
      all_sorted = all_sorted && std::is_sorted(x.begin(), x.end());
    }
    CHECK(all_sorted);
  }
  // Batcher's comparator count for powers of two, (k^2 - k + 4) 2^(k-2) - 1: nothing pruned.
  for (int k = 2; k <= 10; ++k) {
    int64_t nc = 0;
    fd::sort_network(int64_t(1) << k, &nc);
    CHECK(nc == ((k * k - k + 4) << (k - 2)) - 1);
  }
  int64_t n1 = -1, n2 = -1;
  fd::sort_network(1, &n1);
  fd::sort_network(2, &n2);
  CHECK(n1 == 0);
  CHECK(n2 == 1);
}

TEST_CASE_TEMPLATE(
    "sort network: every lane sorted like the stable scalar sort (ties, -0/+0, every m <= 33, every ISA)", T, float,
    double) {
  const int64_t LB = fd::kSortLanes, ld = LB + 3;  // a row stride that is not the lane count
  for (const auto& isa : asap::fast::available_isas()) {
    const auto& tab = [&]() -> const fd::SortNetTable<T>& {
      if constexpr (sizeof(T) == 4)
        return fd::sortnet_for(isa.c_str()).f32;
      else
        return fd::sortnet_for(isa.c_str()).f64;
    }();
    CHECK(std::string(tab.isa) == isa);
    // Every m up to 33: m <= 32 runs networks unrolled at compile time, one per m
    // (sort_impl.h, regnet_rows), the longer ones the comparator loop.
    std::vector<int64_t> ms;
    for (int64_t m = 1; m <= 33; ++m) ms.push_back(m);
    for (int64_t m : {50, 64, 97, 128, 200, 256, 300}) ms.push_back(m);
    for (int64_t m : ms) {
      CAPTURE(isa);
      CAPTURE(m);
      const auto v = lane_data<T>(m, ld, static_cast<uint64_t>(m));
      std::vector<int32_t> pay(m);
      for (int64_t r = 0; r < m; ++r) pay[r] = static_cast<int32_t>(3 * r + 1);  // ascending, not r
      int64_t nc = 0;
      const int32_t* c = fd::sort_network(m, &nc);
      fd::Buf<double> work;  // 64-byte aligned, as the kernels require
      work.get(static_cast<int64_t>(fd::sortnet_work_bytes(m, 0) / 8) + 1);
      std::vector<T> sv(m * LB), sk(m * LB);
      std::vector<int32_t> sp(m * LB);
      tab.sort_lanes(m, v.data(), ld, pay.data(), c, nc, work.data(), sv.data(), sp.data());
      tab.sort_lanes(m, v.data(), ld, nullptr, c, nc, work.data(), sk.data(), nullptr);
      fd::SortScratch<T> scratch;
      std::vector<int32_t> order;
      std::vector<double> sorted(m);
      int bad_order = 0, bad_value = 0, bad_keys = 0, bad_scalar = 0;
      for (int l = 0; l < LB; ++l) {
        const auto expect = stable_order(v, m, ld, l);
        // The scalar path of the features (sort.h) on the same lane.
        std::vector<T> lane(m);
        for (int64_t r = 0; r < m; ++r) lane[r] = v[r * ld + l];
        fd::sorted_with_order(m, lane.data(), scratch, order, sorted.data());
        bad_scalar += order != expect;
        for (int64_t r = 0; r < m; ++r) {
          bad_order += sp[r * LB + l] != pay[expect[r]];
          // Values come back as sorted: -0 as +0, like the scalar sort's keys.
          const T want = v[expect[r] * ld + l] + T(0);
          bad_value += !(sv[r * LB + l] == want) || std::signbit(sv[r * LB + l]) != std::signbit(want);
          bad_keys += !(sk[r * LB + l] == want) || std::signbit(sk[r * LB + l]) != std::signbit(want);
          bad_scalar += !(static_cast<T>(sorted[r]) == want);
        }
      }
      CHECK(bad_order == 0);
      CHECK(bad_value == 0);
      CHECK(bad_keys == 0);
      CHECK(bad_scalar == 0);
    }
  }
}

TEST_CASE("sort network: features equal the scalar sorts and the reference (dtypes, masks, ties, every ISA)") {
  at::manual_seed(77);
  const int64_t d = 6;
  // Axis-aligned slices on integer data: exact ties in every projection.
  auto axes = at::zeros({d, 20}, at::kDouble);
  for (int64_t l = 0; l < 20; ++l) axes[l % d][l] = 1.0;
  std::vector<asap::FeatureFamily> fams(3);
  fams[0].slices = 16;                               // one full lane block
  fams[1].slices = 5, fams[1].alpha = true;          // a partial block
  fams[2].slices = 20, fams[2].softmax_dual = true;  // a full and a partial block
  for (auto dtype : {at::kDouble, at::kFloat}) {
    for (int64_t n : {1, 2, 3, 7, 16, 17, 50, 64, 97}) {
      for (int tie : {0, 1}) {
        for (int mk : {0, 1, 2}) {  // no mask, keep padded queries, drop them
          const bool masked = mk > 0, drop = mk == 2;
          const int64_t B = 3, H = 2;
          auto q = at::randn({B, H, n, d}, dtype), k = at::randn({B, H, n, d}, dtype);
          if (tie) {
            q = at::round(q * 2), k = at::round(k * 2);
            if (n > 4) q.select(2, 1).copy_(q.select(2, 3)), k.select(2, 0).copy_(k.select(2, 2));
            // Signed zeros: -0 and +0 must tie.
            q = q.where(q != 0, at::zeros_like(q).neg().where(at::rand_like(q) < 0.5, at::zeros_like(q)));
          }
          auto mask = masked ? sparse_mask(B, n) : at::Tensor();
          const double scale = 1.0 / std::sqrt(static_cast<double>(d)), eps = 0.7;
          auto m = asap::log_marginals(mask, B, n, drop, dtype, at::kCPU);
          for (const auto& fam : fams) {
            auto theta = tie ? axes.slice(1, 0, fam.slices) : asap::make_slice_bank(d, fam.slices, 5);
            auto ref = asap::build_features(q, k, m, theta, fam, scale, eps);
            for (const auto& cfg : configs()) {
              CAPTURE(dtype);
              CAPTURE(n);
              CAPTURE(tie);
              CAPTURE(mk);
              CAPTURE(fam.name());
              CAPTURE(cfg.name);
              Threads th(cfg.threads);
              at::Tensor net, scal;
              {
                ForcePath f(fd::SortPath::kNetwork);
                net = asap::fast::build_features(q, k, mask, drop, theta, fam, scale, eps, cfg.tuning);
              }
              {
                ForcePath f(fd::SortPath::kScalar);
                scal = asap::fast::build_features(q, k, mask, drop, theta, fam, scale, eps, cfg.tuning);
              }
              CHECK_REL(net, ref, tol_of(dtype));
              CHECK_REL(net, scal, tol_of(dtype));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("sort network: float32 blocks of 2-64 keys (swaps recorded, then undone) give the scalar sorts' bits") {
  // For m <= 64 float32 keys the network sorts the keys alone, records its
  // swaps and carries the potentials back by undoing them (sort_impl.h,
  // slice_block_recorded; m > 32 as two halves and their merge); m = 65
  // takes the (key, position) words. Every m,
  // keys consecutive (no mask), consecutive with padded queries after or
  // before them, and with a hole (masked key in the middle), on integer
  // data with exact ties; the columns must be the scalar sorts' bit for bit.
  at::manual_seed(29);
  const int64_t d = 4;
  auto axes = at::zeros({d, 16}, at::kDouble);
  for (int64_t l = 0; l < 16; ++l) axes[l % d][l] = 1.0;
  asap::FeatureFamily fam;
  fam.slices = 16;
  int failures = 0, cases = 0;
  for (int64_t m = 2; m <= 65; ++m) {
    // No mask; 3 padded rows after the keys; one before them; a hole.
    for (int layout : {0, 1, 2, 3}) {
      const int64_t n = layout == 0 ? m : m + (layout == 1 ? 3 : 1);
      at::Tensor mask;
      if (layout == 1) mask = at::arange(n).lt(m).unsqueeze(0);
      if (layout == 2) mask = at::arange(n).ge(1).unsqueeze(0);
      if (layout == 3) mask = at::arange(n).ne(n / 2).unsqueeze(0);
      for (int tie : {0, 1}) {
        auto q = at::randn({1, 1, n, d}), k = at::randn({1, 1, n, d});
        if (tie) q = at::round(q * 2), k = at::round(k * 2);
        auto theta = tie ? axes : asap::make_slice_bank(d, 16, 8);
        for (const auto& cfg : configs()) {
          Threads th(cfg.threads);
          at::Tensor net, scal;
          {
            ForcePath f(fd::SortPath::kNetwork);
            net = asap::fast::build_features(q, k, mask, false, theta, fam, 0.5, 0.8, cfg.tuning);
          }
          {
            ForcePath f(fd::SortPath::kScalar);
            scal = asap::fast::build_features(q, k, mask, false, theta, fam, 0.5, 0.8, cfg.tuning);
          }
          ++cases;
          if (!at::equal(net, scal)) {
            ++failures;
            MESSAGE("m = " << m << ", layout " << layout << ", tie " << tie << ", " << cfg.name
                           << ": largest difference " << (net - scal).abs().max().item<float>());
          }
        }
      }
    }
  }
  CHECK(cases > 0);
  CHECK(failures == 0);
}

TEST_CASE("sort network: the path is chosen per head's key count within one call (cached per L, m)") {
  // One call, one thread: sequence 0 has 3000 active keys (the scalar sorts
  // on every ISA), sequence 1 only 40 (the networks). The engine caches
  // use_network's answer; it must be asked again when m changes. float64,
  // padded queries dropped (so sequence 1's rows are its 40 keys): there the
  // two paths' centering (sorted against row order) differs in the last
  // bits, so the outputs show which path ran.
  at::manual_seed(17);
  const int64_t n = 3000, d = 4;
  auto q = at::randn({2, 1, n, d}, at::kDouble), k = at::randn({2, 1, n, d}, at::kDouble);
  auto mask = at::ones({2, n}, at::kBool);
  mask[1].slice(0, 40).fill_(false);
  asap::FeatureFamily fam;
  fam.slices = 16;
  auto theta = asap::make_slice_bank(d, 16, 2);
  for (const auto& isa : asap::fast::available_isas()) {
    CAPTURE(isa);
    REQUIRE_FALSE(fd::use_network(isa.c_str(), true, 16, n));
    REQUIRE(fd::use_network(isa.c_str(), true, 16, 40));
    asap::fast::Tuning t;
    t.isa = isa;
    Threads th(1);
    at::Tensor a, net, scal;
    {
      ForcePath f(fd::SortPath::kAuto);
      a = asap::fast::build_features(q, k, mask, true, theta, fam, 0.5, 1.0, t);
    }
    {
      ForcePath f(fd::SortPath::kNetwork);
      net = asap::fast::build_features(q, k, mask, true, theta, fam, 0.5, 1.0, t);
    }
    {
      ForcePath f(fd::SortPath::kScalar);
      scal = asap::fast::build_features(q, k, mask, true, theta, fam, 0.5, 1.0, t);
    }
    REQUIRE_FALSE(at::equal(net[1], scal[1]));  // else the check below could not tell the paths apart
    CHECK(at::equal(a[0], scal[0]));
    CHECK(at::equal(a[1], net[1]));
  }
}

TEST_CASE("sort network: the compiled operator with the network equals the reference (phi_hat, outputs)") {
  at::manual_seed(91);
  const int64_t B = 2, H = 3, d = 8;
  for (auto dtype : {at::kDouble, at::kFloat}) {
    for (int64_t n : {1, 2, 17, 50}) {
      for (int mk : {0, 1, 2}) {
        for (bool per_head : {false, true}) {
          const bool drop = mk == 2;
          asap::CompiledLayer L;
          L.spec.name = "sort.layer";
          L.spec.layout = asap::ProjLayout::kNone;
          L.spec.heads = H;
          L.spec.head_dim = d;
          L.spec.value_dim = d;
          L.spec.score_scale = 1.0 / std::sqrt(static_cast<double>(d));
          L.spec.eps = 0.9;
          L.spec.T = 6;
          L.spec.mask = drop ? asap::MaskConvention::kDropQueries : asap::MaskConvention::kKeepQueries;
          L.theta = asap::make_slice_bank(d, 24, 3);
          L.family.slices = 24;
          L.family.alpha = true;
          L.per_head = per_head;
          L.coef = at::randn({per_head ? H : 1, L.family.num_columns()}, at::kDouble) * 0.3;
          L.default_closures = 3;
          auto q = at::randn({B, H, n, d}, dtype), k = at::randn({B, H, n, d}, dtype);
          auto v = at::randn({B, H, n, d}, dtype);
          auto mask = mk ? sparse_mask(B, n) : at::Tensor();
          asap::RunOptions o;
          o.closures = 2;
          o.return_phi = true;
          auto ref = asap::run_layer_reference(L, q, k, v, mask, o);
          for (const auto& cfg : configs()) {
            CAPTURE(dtype);
            CAPTURE(n);
            CAPTURE(mk);
            CAPTURE(per_head);
            CAPTURE(cfg.name);
            Threads th(cfg.threads);
            ForcePath f(fd::SortPath::kNetwork);
            auto r = asap::fast::asap_layer(L, q, k, v, mask, o, cfg.tuning);
            CHECK_REL(r.phi_hat, ref.phi_hat, tol_of(dtype));
            CHECK_REL(r.out, ref.out, tol_of(dtype));
          }
        }
      }
    }
  }
}

TEST_CASE("sort network: the default path picks the network where it wins, the scalar sorts elsewhere") {
  // The measured rule (sort_network.cpp): full lane blocks of float32 on
  // AVX-512 up to long sequences, float64 on the baseline set only for short ones.
  CHECK(fd::use_network("avx512", false, 16, 50));
  CHECK(fd::use_network("avx512", false, 64, 1024));
  CHECK(fd::use_network("avx2", false, 16, 256));
  CHECK(fd::use_network("avx512", true, 64, 256));
  CHECK_FALSE(fd::use_network("avx512", false, 64, 8192));
  CHECK_FALSE(fd::use_network("generic", true, 16, 1024));
  CHECK_FALSE(fd::use_network("avx2", false, 1, 50));  // one slice: 16 lanes of work for one
  CHECK(fd::use_network("avx512", false, 4, 128));
  CHECK_FALSE(fd::use_network("avx512", false, 4, 1024));
  // kAuto gives exactly the result of the path the rule names.
  at::manual_seed(5);
  const int64_t d = 4;
  for (int64_t n : {40, 5000}) {
    auto q = at::randn({1, 1, n, d}, at::kFloat), k = at::randn({1, 1, n, d}, at::kFloat);
    asap::FeatureFamily fam;
    fam.slices = 16;
    auto theta = asap::make_slice_bank(d, 16, 1);
    at::Tensor a, net, scal;
    {
      ForcePath f(fd::SortPath::kAuto);
      a = asap::fast::build_features(q, k, at::Tensor(), false, theta, fam, 0.5, 1.0);
    }
    {
      ForcePath f(fd::SortPath::kNetwork);
      net = asap::fast::build_features(q, k, at::Tensor(), false, theta, fam, 0.5, 1.0);
    }
    {
      ForcePath f(fd::SortPath::kScalar);
      scal = asap::fast::build_features(q, k, at::Tensor(), false, theta, fam, 0.5, 1.0);
    }
    const bool use = fd::use_network(asap::fast::isa_for().c_str(), false, 16, n);
    CAPTURE(n);
    CAPTURE(use);
    CHECK(at::equal(a, use ? net : scal));
    CHECK(rel_err(net, scal) <= 1e-5);
  }
}
