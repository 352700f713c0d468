// Joining consecutive batches of examples (the calibration reader across
// files, the layer stream across index runs): one tensor field of every
// batch concatenated along the example dimension; undefined when the first
// batch does not have the field (e.g. no mask).
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <vector>

namespace asap {
namespace detail {

template <class Batch>
at::Tensor cat_field(const std::vector<Batch>& parts, at::Tensor Batch::*field) {
  if (parts.empty() || !(parts[0].*field).defined()) return at::Tensor();
  std::vector<at::Tensor> ts;
  ts.reserve(parts.size());
  for (const auto& p : parts) ts.push_back(p.*field);
  return at::cat(ts, 0);
}

}  // namespace detail
}  // namespace asap
