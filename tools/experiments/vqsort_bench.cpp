// Issue 14, item 2: does Highway's vqsort (Debian libhwy-dev 1.0.3) beat
// asapc's own stable argsort (src/lib/fast/sort.h) for the sliced-feature
// sorts at long sequences? Build and run with tools/experiments/vqsort_bench.sh.
//
// Workload per "head": 2*L = 128 sorts of m values (L = 64 slices, queries
// and keys), values = projections of Gaussian vectors (d = 64) on random unit
// directions. Every method reads the original values and writes the same
// outputs as asapc's entry point sorted_with_order (the order, ties by
// position, and the sorted values as doubles), so each sort works on fresh
// data and the key building / extraction is timed for every method.
//
// Methods (argsort):
//   asapc   detail::sorted_with_order (the call used in engine.cpp)
//   vq/new  hwy::Sorter constructed per sort (1.0.3 has no free VQSort
//           function; this is the "one call" cost: allocation + sort)
//   vq/reuse one hwy::Sorter reused for all sorts
//   std     std::sort on the same keys
// float32 keys: uint64 (sort_key(v) << 32) | index; float64 keys: hwy::uint128_t
// {hi = sort_key(v), lo = index}, sorted as 128-bit keys.
// Also a values-only table (the other half of the workload: sorted_values).
//
// Usage: vqsort_bench [reps=41] [--check-only] [--probe N]
//   --probe N: N sorts of m = 512 with a fresh Sorter, then N with one reused
//   Sorter (for strace -c to count syscalls per call), no timing table.
#include <hwy/contrib/sort/vqsort.h>
#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fast/sort.h"

using asap::fast::detail::key_value;
using asap::fast::detail::sort_key;
using asap::fast::detail::sorted_values;
using asap::fast::detail::sorted_with_order;
using asap::fast::detail::SortScratch;

namespace {

constexpr int kL = 64;          // slices
constexpr int kSorts = 2 * kL;  // sorts per head (queries and keys)
constexpr int kD = 64;          // head dimension for the projections

const hwy::Sorter& shared_sorter() {
  static hwy::Sorter s;
  return s;
}

// ---------------------------------------------------------------- float32 argsort
struct F32Buf {
  std::vector<uint64_t> w;
};

inline void f32_keys(int64_t m, const float* v, uint64_t* w) {
  for (int64_t r = 0; r < m; ++r) w[r] = (static_cast<uint64_t>(sort_key(v[r])) << 32) | static_cast<uint64_t>(r);
}
inline void f32_extract(int64_t m, const uint64_t* w, std::vector<int32_t>& order, double* out) {
  order.resize(m);
  for (int64_t r = 0; r < m; ++r) {
    order[r] = static_cast<int32_t>(w[r] & 0xFFFFFFFFu);
    out[r] = static_cast<double>(key_value(static_cast<uint32_t>(w[r] >> 32)));
  }
}

enum Method { kAsapc = 0, kVqNew, kVqReuse, kStd, kNumMethods };
const char* kNames[kNumMethods] = {"asapc", "vq/new", "vq/reuse", "std::sort"};

void argsort_f32(Method me, int64_t m, const float* v, SortScratch<float>& s, F32Buf& b, std::vector<int32_t>& order,
                 double* out) {
  if (me == kAsapc) {
    sorted_with_order(m, v, s, order, out);
    return;
  }
  b.w.resize(m);
  f32_keys(m, v, b.w.data());
  if (me == kVqNew) {
    hwy::Sorter sorter;
    sorter(b.w.data(), static_cast<size_t>(m), hwy::SortAscending());
  } else if (me == kVqReuse) {
    shared_sorter()(b.w.data(), static_cast<size_t>(m), hwy::SortAscending());
  } else {
    std::sort(b.w.begin(), b.w.begin() + m);
  }
  f32_extract(m, b.w.data(), order, out);
}

// ---------------------------------------------------------------- float64 argsort
struct F64Buf {
  std::vector<hwy::uint128_t> w;
};

void argsort_f64(Method me, int64_t m, const double* v, SortScratch<double>& s, F64Buf& b, std::vector<int32_t>& order,
                 double* out) {
  if (me == kAsapc) {
    sorted_with_order(m, v, s, order, out);
    return;
  }
  b.w.resize(m);
  hwy::uint128_t* w = b.w.data();
  for (int64_t r = 0; r < m; ++r) {
    w[r].hi = sort_key(v[r]);
    w[r].lo = static_cast<uint64_t>(r);
  }
  if (me == kVqNew) {
    hwy::Sorter sorter;
    sorter(w, static_cast<size_t>(m), hwy::SortAscending());
  } else if (me == kVqReuse) {
    shared_sorter()(w, static_cast<size_t>(m), hwy::SortAscending());
  } else {
    std::sort(w, w + m, [](const hwy::uint128_t& a, const hwy::uint128_t& c) { return a < c; });
  }
  order.resize(m);
  for (int64_t r = 0; r < m; ++r) {
    order[r] = static_cast<int32_t>(w[r].lo);
    out[r] = v[order[r]];
  }
}

// ---------------------------------------------------------------- float32 values only
// asapc: sorted_values (keys as uint32, bucket sort / radix); vqsort and
// std::sort on the same uint32 keys, converted back the same way.
void values_f32(Method me, int64_t m, const float* v, SortScratch<float>& s, std::vector<uint32_t>& k, double* out) {
  if (me == kAsapc) {
    sorted_values<float>(m, v, s, out);
    return;
  }
  k.resize(m);
  for (int64_t r = 0; r < m; ++r) k[r] = sort_key(v[r]);
  if (me == kVqNew) {
    hwy::Sorter sorter;
    sorter(k.data(), static_cast<size_t>(m), hwy::SortAscending());
  } else if (me == kVqReuse) {
    shared_sorter()(k.data(), static_cast<size_t>(m), hwy::SortAscending());
  } else {
    std::sort(k.begin(), k.begin() + m);
  }
  for (int64_t r = 0; r < m; ++r) out[r] = static_cast<double>(key_value(k[r]));
}

// ---------------------------------------------------------------- data
// kSorts slices of m projections each: slice j = <theta_j, x_r>, x_r ~ N(0, I_d).
template <class T>
std::vector<T> projections(int64_t m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<double> x(static_cast<size_t>(m) * kD);
  for (auto& e : x) e = g(rng);
  std::vector<T> out(static_cast<size_t>(kSorts) * m);
  std::vector<double> th(kD);
  for (int j = 0; j < kSorts; ++j) {
    if (j == kL) {  // keys: a second set of vectors
      for (auto& e : x) e = g(rng);
    }
    double nn = 0;
    for (auto& e : th) {
      e = g(rng);
      nn += e * e;
    }
    nn = std::sqrt(nn);
    for (int64_t r = 0; r < m; ++r) {
      double acc = 0;
      for (int c = 0; c < kD; ++c) acc += th[c] / nn * x[r * kD + c];
      out[static_cast<size_t>(j) * m + r] = static_cast<T>(acc);
    }
  }
  return out;
}

double now_ns() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

double median(std::vector<double> a) {
  std::sort(a.begin(), a.end());
  const size_t n = a.size();
  return n % 2 ? a[n / 2] : 0.5 * (a[n / 2 - 1] + a[n / 2]);
}

// ---------------------------------------------------------------- correctness
template <class T>
std::vector<std::pair<std::string, std::vector<T>>> check_inputs(int64_t m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<T> rnd(m), ties(m), few(m), asc, desc, zeros(m), same(m, T(1.5));
  for (int64_t r = 0; r < m; ++r) {
    rnd[r] = static_cast<T>(g(rng));
    ties[r] = static_cast<T>(std::round(g(rng)));                                        // about 7 levels
    few[r] = static_cast<T>(std::round(g(rng) * 8.0) / 8.0);                             // about 50 levels
    zeros[r] = (r % 3 == 0) ? T(-0.0) : (r % 3 == 1 ? T(0.0) : static_cast<T>(g(rng)));  // -0 ties +0
  }
  asc = rnd;
  std::sort(asc.begin(), asc.end());
  desc = asc;
  std::reverse(desc.begin(), desc.end());
  std::vector<T> asc_ties = ties;
  std::sort(asc_ties.begin(), asc_ties.end());
  std::vector<T> desc_ties = asc_ties;
  std::reverse(desc_ties.begin(), desc_ties.end());
  return {{"random", rnd},
          {"ties7", ties},
          {"ties50", few},
          {"sorted", asc},
          {"reversed", desc},
          {"sorted_ties", asc_ties},
          {"reversed_ties", desc_ties},
          {"pm_zero", zeros},
          {"all_equal", same}};
}

int check_all() {
  int bad = 0, cases = 0;
  const int64_t sizes[] = {1, 2, 17, 48, 49, 100, 256, 512, 1000, 1024, 2048, 4096, 5000};
  SortScratch<float> sf;
  SortScratch<double> sd;
  F32Buf bf;
  F64Buf bd;
  std::vector<uint32_t> kv;
  for (int64_t m : sizes) {
    for (auto& [name, v] : check_inputs<float>(m, 1000 + m)) {
      std::vector<int32_t> ref, o;
      std::vector<double> refv(m), out(m);
      argsort_f32(kAsapc, m, v.data(), sf, bf, ref, refv.data());
      // reference of the reference: stable std::stable_sort by operator<
      std::vector<int32_t> st(m);
      for (int64_t r = 0; r < m; ++r) st[r] = static_cast<int32_t>(r);
      std::stable_sort(st.begin(), st.end(), [&](int32_t a, int32_t c) { return v[a] < v[c]; });
      ++cases;
      if (st != ref) {
        ++bad;
        std::printf("MISMATCH f32 asapc vs stable_sort m=%lld %s\n", (long long)m, name.c_str());
      }
      std::vector<double> refsv(m);
      sorted_values<float>(m, v.data(), sf, refsv.data());
      ++cases;
      if (refsv != refv) {
        ++bad;
        std::printf("MISMATCH f32 sorted_values vs sorted_with_order m=%lld %s\n", (long long)m, name.c_str());
      }
      for (int me = kVqNew; me < kNumMethods; ++me) {
        argsort_f32(static_cast<Method>(me), m, v.data(), sf, bf, o, out.data());
        ++cases;
        if (o != ref || out != refv) {
          ++bad;
          std::printf("MISMATCH f32 argsort %s m=%lld %s\n", kNames[me], (long long)m, name.c_str());
        }
        values_f32(static_cast<Method>(me), m, v.data(), sf, kv, out.data());
        ++cases;
        if (out != refsv) {
          ++bad;
          std::printf("MISMATCH f32 values %s m=%lld %s\n", kNames[me], (long long)m, name.c_str());
        }
      }
    }
    for (auto& [name, v] : check_inputs<double>(m, 2000 + m)) {
      std::vector<int32_t> ref, o;
      std::vector<double> refv(m), out(m);
      argsort_f64(kAsapc, m, v.data(), sd, bd, ref, refv.data());
      for (int me = kVqNew; me < kNumMethods; ++me) {
        argsort_f64(static_cast<Method>(me), m, v.data(), sd, bd, o, out.data());
        ++cases;
        if (o != ref || out != refv) {
          ++bad;
          std::printf("MISMATCH f64 argsort %s m=%lld %s\n", kNames[me], (long long)m, name.c_str());
        }
      }
    }
  }
  std::printf("correctness: %d/%d cases identical to asapc (order incl. ties, and values)%s\n", cases - bad, cases,
              bad ? "  <-- FAILURES" : "");
  return bad;
}

// ---------------------------------------------------------------- timing
// One timed sample = one head (kSorts sorts) for one method; the methods are
// interleaved within each repetition so that load changes hit all alike.
template <class Fn>
void time_table(const char* title, int reps, const Fn& head_fn /* (method, m) -> void */) {
  const int64_t ms[] = {256, 512, 1024, 2048, 4096};
  std::printf("\n%s (ns per element, median of %d heads of %d sorts)\n", title, reps, kSorts);
  std::printf("%6s %9s %9s %9s %9s %10s %10s\n", "m", "asapc", "vq/new", "vq/reuse", "std::sort", "vqnew/as",
              "vqreuse/as");
  for (int64_t m : ms) {
    std::vector<double> t[kNumMethods];
    for (int me = 0; me < kNumMethods; ++me) head_fn(static_cast<Method>(me), m);  // warm-up
    for (int rep = 0; rep < reps; ++rep) {
      for (int k = 0; k < kNumMethods; ++k) {
        const int me = (k + rep) % kNumMethods;  // rotate the order
        const double t0 = now_ns();
        head_fn(static_cast<Method>(me), m);
        t[me].push_back((now_ns() - t0) / (static_cast<double>(kSorts) * m));
      }
    }
    double med[kNumMethods];
    for (int me = 0; me < kNumMethods; ++me) med[me] = median(t[me]);
    std::printf("%6lld %9.2f %9.2f %9.2f %9.2f %10.2f %10.2f\n", (long long)m, med[kAsapc], med[kVqNew], med[kVqReuse],
                med[kStd], med[kVqNew] / med[kAsapc], med[kVqReuse] / med[kAsapc]);
    std::fflush(stdout);
  }
}

volatile double g_sink;

// Cost of the getrandom(2) call vqsort 1.0.3 makes on every sort (seen with
// strace -c: one getrandom per sort, reused Sorter or not), in ns per call.
double getrandom_ns() {
  unsigned char buf[24];
  std::vector<double> t;
  for (int rep = 0; rep < 21; ++rep) {
    const int n = 2000;
    const double t0 = now_ns();
    for (int i = 0; i < n; ++i)
      if (getrandom(buf, sizeof buf, 0) != static_cast<ssize_t>(sizeof buf)) std::abort();
    t.push_back((now_ns() - t0) / n);
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 41;
  bool check_only = false;
  long probe = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check-only")
      check_only = true;
    else if (a == "--probe" && i + 1 < argc)
      probe = std::atol(argv[++i]);
    else
      reps = std::atoi(argv[i]);
  }
  if (probe > 0) {  // for `strace -c`: syscalls of N fresh-Sorter sorts, then N reused
    const int64_t m = 512;
    std::vector<float> v = projections<float>(m, 7);
    SortScratch<float> s;
    F32Buf b;
    std::vector<int32_t> o;
    std::vector<double> out(m);
    const Method which = std::getenv("PROBE_REUSE") ? kVqReuse : kVqNew;
    const double t0 = now_ns();
    for (long i = 0; i < probe; ++i) argsort_f32(which, m, v.data(), s, b, o, out.data());
    std::printf("%s: %ld sorts of m=%lld, %.1f us per sort\n", kNames[which], probe, (long long)m,
                (now_ns() - t0) / probe / 1e3);
    return 0;
  }
  if (check_all() != 0) return 1;
  if (check_only) return 0;
  {
    const double g = getrandom_ns();
    std::printf(
        "getrandom(24 bytes): %.0f ns per call = %.2f / %.2f / %.2f / %.2f / %.2f ns per element at m = 256 / "
        "512 / 1024 / 2048 / 4096\n",
        g, g / 256, g / 512, g / 1024, g / 2048, g / 4096);
  }

  // float32 argsort
  {
    SortScratch<float> s;
    F32Buf b;
    std::vector<int32_t> o;
    std::vector<double> out;
    int64_t cur = -1;
    std::vector<float> data;
    time_table("float32 argsort (sorted_with_order)", reps, [&](Method me, int64_t m) {
      if (m != cur) {
        data = projections<float>(m, 42 + m);
        out.resize(m);
        cur = m;
      }
      double acc = 0;
      for (int j = 0; j < kSorts; ++j) {
        argsort_f32(me, m, data.data() + static_cast<size_t>(j) * m, s, b, o, out.data());
        acc += out[m / 2] + o[0];
      }
      g_sink = acc;
    });
  }
  // float32 values only
  {
    SortScratch<float> s;
    std::vector<uint32_t> k;
    std::vector<double> out;
    int64_t cur = -1;
    std::vector<float> data;
    time_table("float32 values only (sorted_values)", reps, [&](Method me, int64_t m) {
      if (m != cur) {
        data = projections<float>(m, 43 + m);
        out.resize(m);
        cur = m;
      }
      double acc = 0;
      for (int j = 0; j < kSorts; ++j) {
        values_f32(me, m, data.data() + static_cast<size_t>(j) * m, s, k, out.data());
        acc += out[m / 2];
      }
      g_sink = acc;
    });
  }
  // float64 argsort
  {
    SortScratch<double> s;
    F64Buf b;
    std::vector<int32_t> o;
    std::vector<double> out;
    int64_t cur = -1;
    std::vector<double> data;
    time_table("float64 argsort (sorted_with_order)", reps, [&](Method me, int64_t m) {
      if (m != cur) {
        data = projections<double>(m, 44 + m);
        out.resize(m);
        cur = m;
      }
      double acc = 0;
      for (int j = 0; j < kSorts; ++j) {
        argsort_f64(me, m, data.data() + static_cast<size_t>(j) * m, s, b, o, out.data());
        acc += out[m / 2] + o[0];
      }
      g_sink = acc;
    });
  }
  return 0;
}
