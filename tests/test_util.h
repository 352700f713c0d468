// Helpers shared by the tests: golden JSON loading and tensor comparison.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <doctest/doctest.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "asap/error.h"

namespace asap_test {

// A fresh directory under the system temp directory, removed with everything in it.
struct TempDir {
  std::filesystem::path dir;
  std::string path;  // dir as a string
  explicit TempDir(const std::string& prefix = "asap-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (dir / name).string(); }
  std::string operator/(const std::string& name) const { return file(name); }
  // File names in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
};

// Sets LibTorch's intra-op threads for a scope; the tests switch thousands of
// times. at::set_num_threads also rebuilds caffe2's pthreadpool (QNNPACK's),
// whose new workers spin for milliseconds: a switch and back cost 8 ms of
// wall time and 16 of CPU on a 2-core machine (docs/reliability.md, "Test
// time"), most of the fused-call tests' time. On LibTorch's OpenMP backend
// at::get_num_threads() is omp_get_max_threads(), which omp_set_num_threads
// sets alone, as at::set_num_threads does; where that does not take (another
// backend), at::set_num_threads.
struct Threads {
  explicit Threads(int n) : old_(at::get_num_threads()) { REQUIRE(set(n) == n); }
  ~Threads() { set(old_); }
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;
  // Returns the count in effect after.
  static int set(int n) {
    if (at::get_num_threads() == n) return n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    if (at::get_num_threads() != n) at::set_num_threads(n);
    return at::get_num_threads();
  }
  int old_;
};

// The message of the asap::Error that f throws (fails the test when none is thrown).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const asap::Error& e) {
    return e.what();
  }
  FAIL("expected asap::Error, nothing was thrown");
  return "";
}

inline std::string data_path(const std::string& name) { return std::string(ASAP_TEST_DATA) + "/" + name; }

inline nlohmann::json load_json(const std::string& name) {
  std::ifstream in(data_path(name));
  REQUIRE_MESSAGE(in.good(), "missing test data " << name);
  return nlohmann::json::parse(in);
}

// A nested JSON list (vector or matrix) as a float64 tensor; -1e300 -> -inf.
inline at::Tensor tensor_from_json(const nlohmann::json& j) {
  std::vector<double> flat;
  std::vector<int64_t> shape;
  if (j.is_array() && !j.empty() && j[0].is_array()) {
    shape = {static_cast<int64_t>(j.size()), static_cast<int64_t>(j[0].size())};
    for (const auto& row : j)
      for (const auto& v : row) flat.push_back(v.get<double>());
  } else {
    shape = {static_cast<int64_t>(j.size())};
    for (const auto& v : j) flat.push_back(v.get<double>());
  }
  for (double& v : flat)
    if (v <= -1e299) v = -std::numeric_limits<double>::infinity();
  return at::tensor(flat, at::kDouble).reshape(shape);
}

// Largest absolute difference, treating equal infinities as equal.
inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  auto x = a.to(at::kDouble).contiguous(), y = b.to(at::kDouble).contiguous();
  REQUIRE(x.sizes() == y.sizes());
  auto both_inf = at::isinf(x) & at::isinf(y) & (x.sign() == y.sign());
  auto d = (x - y).abs().masked_fill(both_inf, 0.0);
  return d.numel() ? d.max().item<double>() : 0.0;
}

// max |a - b| / max(1, max finite |b|), equal infinities counting as equal;
// NaN anywhere counts as a huge error. The fast-path tests' measure.
inline double rel_err(const at::Tensor& a, const at::Tensor& b) {
  REQUIRE(a.defined());
  REQUIRE(b.defined());
  auto x = a.to(at::kDouble).contiguous(), y = b.to(at::kDouble).contiguous();
  REQUIRE(x.sizes() == y.sizes());
  auto both_inf = at::isinf(x) & at::isinf(y) & (x.sign() == y.sign());
  auto d = (x - y).abs().masked_fill(both_inf, 0.0);
  if (!d.numel()) return 0.0;
  const double scale = std::max(1.0, y.masked_fill(at::isinf(y), 0.0).abs().max().item<double>());
  const double e = d.max().item<double>() / scale;
  return std::isnan(e) ? 1e300 : e;
}

// The fast path's tolerance against the reference, by dtype.
inline double tol_of(at::ScalarType t) { return t == at::kFloat ? 1e-5 : 1e-10; }

}  // namespace asap_test

#define CHECK_REL(a, b, tol)                                                             \
  do {                                                                                   \
    const double asap_rel_ = asap_test::rel_err((a), (b));                               \
    CHECK_MESSAGE(asap_rel_ <= (tol), "relative error " << asap_rel_ << " > " << (tol)); \
  } while (0)

#define CHECK_CLOSE_T(a, b, tol)                                                        \
  do {                                                                                  \
    double asap_err_ = asap_test::max_abs_diff((a), (b));                               \
    CHECK_MESSAGE(asap_err_ <= (tol), "max abs error " << asap_err_ << " > " << (tol)); \
  } while (0)
