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

}  // namespace asap
