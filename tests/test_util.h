// Helpers shared by the tests: golden JSON loading and tensor comparison.
#pragma once
#include <ATen/ATen.h>
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace asap_test {

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

}  // namespace asap_test

#define CHECK_CLOSE_T(a, b, tol)                                               \
  do {                                                                         \
    double asap_err_ = asap_test::max_abs_diff((a), (b));                      \
    CHECK_MESSAGE(asap_err_ <= (tol), "max abs error " << asap_err_ << " > " << (tol)); \
  } while (0)
