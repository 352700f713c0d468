// asap/layer_call.h -- what one call of a compiled layer takes and returns.
//
// Shared by the three layers of the run-time code, which depend on each
// other in one direction only (docs/performance.md, "Layering"):
//
//   asap/runtime.h   run_teacher, run_layer, CompiledModel: the one place
//        |           that chooses between the two paths below
//        +--> fast/fast.h      fused CPU kernels (src/lib/fast/)
//        +--> asap/teacher.h,  ATen reference (src/lib/reference/)
//             asap/operator.h
//
// Both paths include this header (and the core types of asap/types.h), and
// neither includes the runtime or the other path (docs/architecture.md).
#pragma once
#include <ATen/core/Tensor.h>

#include "asap/types.h"

namespace asap {

// The teacher conventions of a compiled layer.
Convention convention_of(const LayerSpec& spec);

namespace detail {

// q, k [B, heads, n, head_dim] with equal shapes, v [B, heads, n, dv]: the
// same check and sentence on both paths.
void check_layer_inputs(const CompiledLayer& layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The half-steps a teacher or Sinkhorn layer runs (T or T'), after checking
// that the caller did not ask for closures, which these kinds do not have.
int loop_kind_steps(const CompiledLayer& layer, const RunOptions& opt);

}  // namespace detail
}  // namespace asap
