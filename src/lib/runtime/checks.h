// Argument checks shared by the compiled operator's reference path
// (runtime.cpp) and its fused path (fast/api.cpp), so both refuse the same
// inputs with the same sentence.
#pragma once
#include <ATen/core/Tensor.h>

#include "asap/artifact.h"

namespace asap {
namespace detail {

// q, k [B, heads, n, head_dim] with equal shapes, v [B, heads, n, dv].
void check_layer_inputs(const CompiledLayer& layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace detail
}  // namespace asap
