// The checks both paths of a layer call share (the fused kernels in fast/,
// the ATen reference in reference/), so that each refuses the same inputs
// with the same sentence. Implemented in layer_call.cpp.
#pragma once
#include <ATen/core/Tensor.h>

#include "asap/layer_call.h"
#include "asap/types.h"

namespace asap {
namespace detail {

// q, k [B, heads, n, head_dim] with equal shapes, v [B, heads, n, dv]: the
// same check and sentence on both paths.
void check_layer_inputs(const CompiledLayer& layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The half-steps a teacher or Sinkhorn layer runs (T or T'), after checking
// that the caller did not ask for closures, which these kinds do not have.
int loop_kind_steps(const CompiledLayer& layer, const RunOptions& opt);

}  // namespace detail
}  // namespace asap
