// asap/operator.h -- the compiled operator's math (asap-math.md section 5):
// predict the cost-coordinate dual from features, go back to score
// coordinates, and apply k closures col, row, col, ...
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>

#include "asap/layer_call.h"
#include "asap/teacher.h"

namespace asap {

// phi_hat = Psi . beta: Psi [B, H, n, P]; coef [1, P] (pooled) or [H, P]
// (per head). Result [B, H, n] in Psi's dtype.
at::Tensor predict_phi(const at::Tensor& Psi, const at::Tensor& coef);

// f_hat = phi_hat - alpha on rows that carry mass, -inf on rows that do not.
at::Tensor dual_from_phi(const at::Tensor& phi_hat, const at::Tensor& alpha, const LogMarginals& m);

struct ClosureResult {
  at::Tensor f, g;  // duals of the final plan
  at::Tensor A;     // [B, H, n, n] attention, when requested
  at::Tensor O;     // [B, H, n, dv] head outputs, when v is given
};

// Calls step(k, f, g) after each of the closures 1..k_max, where plan(f, g)
// is the k-closure operator's plan (g = col(f) after odd k, f = row(g) after even k).
void for_each_closure(const at::Tensor& S, const at::Tensor& f_hat, const LogMarginals& m, double eps, int k_max,
                      const std::function<void(int, const at::Tensor&, const at::Tensor&)>& step);

// The teacher's loop warm-started at f_hat with k >= 1 closures:
// g1 = col(f_hat), f1 = row(g1), g2 = col(f1), ...; odd k ends on a column.
ClosureResult run_closures(const at::Tensor& S, const at::Tensor& f_hat, const at::Tensor& v, const LogMarginals& m,
                           const Convention& c, int k, bool want_attention);

// One compiled layer in plain ATen (asap-math.md section 5 step by step;
// the teacher or Sinkhorn loop for the zero-parameter kinds): the
// specification the fused path is tested against. asap::run_layer
// (asap/runtime.h) chooses between this and the fused kernels.
LayerOutput run_layer_reference(const CompiledLayer& layer, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& key_mask, const RunOptions& opt = {});

}  // namespace asap
