// Sorting-network comparators, the run-time choice of the lane-parallel
// sort kernels and of the sort path (see sort_network.h).
#include "fast/sort_network.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "asap/error.h"
#include "util/env.h"

namespace asap {
namespace fast {
namespace detail {

namespace {

// Longest sequence (active keys m) for which the networks beat the scalar
// sorts, per instruction set and dtype, with 1, 4 and 16 slices per lane
// block: the networks cost the same for a block whatever its number of real
// slices, the scalar sorts cost per slice. Measured on the whole feature
// path (fast::build_features, one thread, d = 32, no mask, m = 16, 32, ...,
// 4096, network / scalar time): e.g. float32 AVX-512 with 16 slices per
// block is 0.2-0.35x at m <= 256 and still 0.9x at m = 4096, with 4 slices
// 0.8x at m = 256 and 1.5x at 512, with one slice 1.4x from m = 64 on;
// float64 on the baseline instruction set (no 64-bit vector compare) only
// wins below m = 128. 1 = never (both are trivial there).
struct Crossover {
  const char* isa;
  bool f64;
  double m1, m4, m16;
};
constexpr Crossover kCrossovers[] = {
    {"avx512", false, 48, 256, 4096}, {"avx512", true, 16, 160, 1024}, {"avx2", false, 1, 48, 4096},
    {"avx2", true, 1, 64, 1024},      {"generic", false, 1, 1, 512},   {"generic", true, 1, 1, 64},
};

std::vector<int32_t> build_network(int64_t m) {
  std::vector<int32_t> c;
  for_each_comparator(m, [&](int64_t i, int64_t j) {
    c.push_back(static_cast<int32_t>(i));
    c.push_back(static_cast<int32_t>(j));
  });
  return c;
}

int sort_path_from_env() {
  const char* e = std::getenv("ASAP_FAST_SORT");
  if (!e || !*e || !std::strcmp(e, "auto")) return static_cast<int>(SortPath::kAuto);
  if (!std::strcmp(e, "scalar")) return static_cast<int>(SortPath::kScalar);
  if (!std::strcmp(e, "network")) return static_cast<int>(SortPath::kNetwork);
  throw Error(std::string("environment variable ASAP_FAST_SORT: expected auto, scalar or network, found '") + e + "'");
}

std::atomic<int>& path_state() {
  static std::atomic<int> s{sort_path_from_env()};
  return s;
}

}  // namespace

const SortNetKernels& sortnet_for(const char* isa) {
  const SortNetKernels* k = nullptr;
  if (!std::strcmp(isa, "avx512")) k = sortnet_avx512();
  if (!std::strcmp(isa, "avx2")) k = sortnet_avx2();
  if (!k) k = sortnet_generic();
  return *k;
}

const int32_t* sort_network(int64_t m, int64_t* count) {
  static std::mutex mu;
  static std::map<int64_t, std::vector<int32_t>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(m);
  if (it == cache.end()) it = cache.emplace(m, build_network(m)).first;
  *count = static_cast<int64_t>(it->second.size() / 2);
  return it->second.data();
}

SortPath sort_path() { return static_cast<SortPath>(path_state().load(std::memory_order_relaxed)); }
void set_sort_path(SortPath p) { path_state().store(static_cast<int>(p), std::memory_order_relaxed); }

bool use_network(const char* isa, bool f64, int64_t L, int64_t m) {
  static const int64_t forced = [] {
    const auto m = env_number("ASAP_FAST_SORT_NETWORK_MAX", 0, true, "a whole number of keys, 0 or more");
    return m ? static_cast<int64_t>(std::min(*m, 1e15)) : int64_t(-1);
  }();
  if (forced >= 0) return m <= forced;
  if (L <= 0 || m <= 0) return false;
  const Crossover* c = nullptr;
  for (const auto& x : kCrossovers)
    if (x.f64 == f64 && !std::strcmp(x.isa, isa)) c = &x;
  if (!c) return false;
  // Real slices per lane block, and the crossover interpolated in log-log.
  const int64_t blocks = (L + kSortLanes - 1) / kSortLanes;
  const double u = std::min<double>(kSortLanes, static_cast<double>(L) / static_cast<double>(blocks));
  const double t = std::log2(u);  // 0 .. 4
  const double lm = t <= 2 ? std::log2(c->m1) + (std::log2(c->m4) - std::log2(c->m1)) * t / 2
                           : std::log2(c->m4) + (std::log2(c->m16) - std::log2(c->m4)) * (t - 2) / 2;
  return static_cast<double>(m) <= std::exp2(lm);
}

}  // namespace detail
}  // namespace fast
}  // namespace asap
