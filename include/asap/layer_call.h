// asap/layer_call.h -- what one call of a compiled layer takes and returns.
//
// Shared by the three layers of the run-time code, which depend on each
// other in one direction only (docs/performance.md, "Layering"):
//
//   asap/runtime.h   run_teacher, run_layer, CompiledModel: the one place
//        |           that chooses between the two paths below
//        +--> asap/fast.h      fused CPU kernels (src/lib/fast/)
//        +--> asap/teacher.h,  ATen reference (src/lib/math/)
//             asap/operator.h
//
// Both paths include this header and asap/artifact.h, and neither includes
// the runtime or the other path.
#pragma once
#include <ATen/core/Tensor.h>

#include "asap/artifact.h"
#include "asap/teacher.h"

namespace asap {

struct RunOptions {
  int closures = 0;               // k >= 1 closures; 0 = the layer's compiled default
  bool return_attention = false;  // also return the [B, H, n, n] attention matrix
  bool return_phi = false;        // also return phi_hat (ASAP maps; the reference path always does)
  bool return_features = false;   // also return the feature matrix Psi (ASAP maps)
};

struct LayerOutput {
  at::Tensor out;        // head outputs [B, H, n, dv]
  at::Tensor attention;  // [B, H, n, n] when requested
  at::Tensor phi_hat;    // predicted centered cost-coordinate dual [B, H, n] when requested
  at::Tensor features;   // the centered feature columns Psi [B, H, n, P] when requested
};

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
